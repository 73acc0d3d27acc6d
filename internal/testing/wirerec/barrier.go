package wirerec

import (
	"fmt"

	"github.com/apache/pulsar-client-go/pulsar"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// Barrier returns once every command the consumer had handed to its
// connections before the call has been recorded.
//
// Why this holds: pulsar-client-go v0.19 queues every consumer command
// (FLOW, ACK, REDELIVER_UNACKNOWLEDGED_MESSAGES, SEEK, CLOSE_CONSUMER,
// GET_LAST_MESSAGE_ID) on one channel per connection, written in order by
// one goroutine (connection.go, incomingRequestsCh). GetLastMessageIDs sends
// GET_LAST_MESSAGE_ID on each of the consumer's connections and waits for
// the answers. The proxy forwards in order and records a frame before
// forwarding it, so an answer proves its request, and all that came before
// it on that connection, was recorded. Producers' SEND frames use another
// channel and are not ordered against it.
//
// It cannot cover what the client has not queued yet: its dispatcher sends
// the initial FLOW after SUBSCRIBE succeeds, and refills after handing a
// message to the application, from its own goroutine
// (consumer_partition.go, dispatcher). Wait for those with a deadline, or
// close the consumer: Close waits for the broker's answer to CLOSE_CONSUMER,
// which follows everything the consumer queued before.
func (p *Proxy) Barrier(c pulsar.Consumer) error {
	mark := p.Mark()
	ids, err := c.GetLastMessageIDs()
	if err != nil {
		return fmt.Errorf("wire barrier: %w", err)
	}
	seen := len(p.Events(Filter{Subscription: c.Subscription(), Since: mark}, pb.BaseCommand_GET_LAST_MESSAGE_ID))
	if seen < len(ids) {
		return fmt.Errorf("wire barrier: %d of %d GET_LAST_MESSAGE_ID requests passed the proxy: the consumer bypasses the recorder", seen, len(ids))
	}
	return nil
}
