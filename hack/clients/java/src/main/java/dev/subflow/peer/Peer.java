package dev.subflow.peer;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.ConsumerBuilder;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * A consumer application with the stock Java client and no subflow code: it subscribes, then
 * prints one JSON line per message its application receives and acknowledges it. It ends when
 * its standard input closes, so that the test that started it never leaves it behind.
 *
 * <p>Flags: --url, --topic, --subscription, --type (Exclusive|Shared|Failover|Key_Shared),
 * --name, --queue (receiver queue size), --delay-ms (time the application spends on each message,
 * after reporting it and before acknowledging it), --chunk-expiry-ms (the client's expiry of
 * incomplete chunked messages; the client's default when absent).
 */
public final class Peer {
  private static volatile boolean closing;

  public static void main(String[] args) throws Exception {
    Map<String, String> flags = parse(args);
    PulsarClient client = PulsarClient.builder().serviceUrl(flags.get("url")).build();
    ConsumerBuilder<byte[]> builder =
        client
            .newConsumer(Schema.BYTES)
            .topic(flags.get("topic"))
            .subscriptionName(flags.get("subscription"))
            .subscriptionType(SubscriptionType.valueOf(flags.getOrDefault("type", "Shared")))
            .consumerName(flags.get("name"))
            .receiverQueueSize(Integer.parseInt(flags.getOrDefault("queue", "1000")))
            .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest);
    if (flags.containsKey("chunk-expiry-ms")) {
      builder.expireTimeOfIncompleteChunkedMessage(
          Long.parseLong(flags.get("chunk-expiry-ms")), TimeUnit.MILLISECONDS);
    }
    Consumer<byte[]> consumer = builder.subscribe();
    exitWhenStdinCloses(consumer, client);
    long delayMs = Long.parseLong(flags.getOrDefault("delay-ms", "0"));
    emit("{\"event\":\"ready\"}");
    while (!closing) {
      Message<byte[]> msg;
      try {
        msg = consumer.receive(1, TimeUnit.SECONDS);
      } catch (PulsarClientException e) {
        if (closing) {
          return; // standard input closed: the consumer is being closed
        }
        throw e;
      }
      if (msg == null) {
        continue;
      }
      // When the application got it, before printing.
      long atMicros = ChronoUnit.MICROS.between(Instant.EPOCH, Instant.now());
      emit(
          "{\"event\":\"message\",\"value\":"
              + quote(new String(msg.getData(), StandardCharsets.UTF_8))
              + ",\"id\":"
              + quote(msg.getMessageId().toString())
              + ",\"atMicros\":"
              + atMicros
              + "}");
      if (delayMs > 0) {
        Thread.sleep(delayMs);
      }
      consumer.acknowledge(msg);
    }
  }

  private static void exitWhenStdinCloses(Consumer<byte[]> consumer, PulsarClient client) {
    Thread t =
        new Thread(
            () -> {
              InputStream in = System.in;
              try {
                while (in.read() >= 0) {}
              } catch (IOException ignored) {
                // closed either way
              }
              closing = true;
              try {
                consumer.close();
                client.close();
              } catch (Exception ignored) {
                // exiting anyway
              }
              System.exit(0);
            });
    t.setDaemon(true);
    t.start();
  }

  private static synchronized void emit(String line) {
    System.out.println(line);
    System.out.flush();
  }

  private static String quote(String s) {
    StringBuilder b = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      if (c == '"' || c == '\\') {
        b.append('\\').append(c);
      } else if (c < 0x20) {
        b.append(String.format("\\u%04x", (int) c));
      } else {
        b.append(c);
      }
    }
    return b.append('"').toString();
  }

  private static Map<String, String> parse(String[] args) {
    Map<String, String> out = new HashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      out.put(args[i].replaceFirst("^--", ""), args[i + 1]);
    }
    return out;
  }
}
