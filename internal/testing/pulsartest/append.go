package pulsartest

import (
	"encoding/binary"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// AppendEntries stores n entries of `messages` messages each (a batch when messages > 1) on a
// non-partitioned topic or a partition, as the broker stores a producer's SENDs: ledgers,
// entry ids, broker timestamps and broker-entry indexes, then dispatches to waiting consumers.
// No client is involved, so benchmarks can fill topics with millions of entries quickly. The
// entries share one small payload ("0", "1", ... per message of a batch) and its metadata.
// Memory: about 200 bytes per entry (10^7 entries take about 2 GiB).
func (b *Broker) AppendEntries(topic string, n, messages int) error {
	tn, err := parseTopic(topic)
	if err != nil {
		return err
	}
	if n < 0 || messages < 1 {
		return fmt.Errorf("cannot append %d entries of %d messages", n, messages)
	}
	if b.partitionsOf(tn.full) > 0 {
		return fmt.Errorf("append to the partitions of partitioned topic %q", tn.full)
	}
	t := b.getTopic(tn.full, true)
	now := b.now()
	meta, data, payload := sharedEntryBody(messages, now.UnixMilli())
	hash := t.b.stickyKeyHashOf([]byte(noneKey))
	t.mu.Lock()
	defer t.mu.Unlock()
	t.entries = slices.Grow(t.entries, n)
	for range n {
		l := t.currentLedger(now)
		e := &entry{
			ledgerID: l.id, entryID: uint64(l.entries), data: data, messages: int32(messages),
			publishTime: int64(meta.GetPublishTime()), brokerTime: now.UnixMilli(),
			stickyHash: hash, meta: meta, payload: payload,
		}
		t.storeLocked(l, e, now)
	}
	for _, s := range t.subs {
		s.dispatch()
	}
	return nil
}

// sharedEntryBody is a SEND body (checksum, metadata, payload) of one message or a batch.
func sharedEntryBody(messages int, publishTime int64) (*pb.MessageMetadata, []byte, []byte) {
	meta := &pb.MessageMetadata{
		ProducerName: proto.String("pulsartest-append"),
		SequenceId:   proto.Uint64(0),
		PublishTime:  proto.Uint64(uint64(publishTime)),
	}
	payload := []byte("0")
	if messages > 1 {
		meta.NumMessagesInBatch = proto.Int32(int32(messages))
		payload = nil
		for i := range messages {
			body := []byte(fmt.Sprint(i))
			single, _ := proto.Marshal(&pb.SingleMessageMetadata{PayloadSize: proto.Int32(int32(len(body)))})
			payload = binary.BigEndian.AppendUint32(payload, uint32(len(single)))
			payload = append(append(payload, single...), body...)
		}
	}
	m, _ := proto.Marshal(meta)
	return meta, pb.AppendPayload(nil, m, payload), payload
}
