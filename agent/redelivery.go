package agent

import (
	"github.com/apache/pulsar-client-go/pulsar"
)

// maxRemembered bounds the redelivery filter. The gate holds at most channelCapacity messages
// plus one per taker at each close, so this leaves ample room.
const maxRemembered = 1024

// idKey identifies a message across deliveries; ledger ids are unique within a cluster.
type idKey struct {
	ledger, entry    int64
	batch, partition int32
}

func keyOf(id pulsar.MessageID) idKey {
	return idKey{ledger: id.LedgerID(), entry: id.EntryID(), batch: id.BatchIdx(), partition: id.PartitionIdx()}
}

func (k idKey) after(o idKey) bool {
	switch {
	case k.ledger != o.ledger:
		return k.ledger > o.ledger
	case k.entry != o.entry:
		return k.entry > o.entry
	}
	return k.batch > o.batch
}

// redeliveryFilter remembers messages the gate held while closed. A held message stays
// unacknowledged on the broker; when the consumer reconnects meanwhile, the broker sends it
// again, and the application would get it twice (the raw client would have dropped its queued
// copy on reconnect). The filter drops those copies.
//
// An entry ends when a later message of the same partition arrives (the broker redelivers in
// order, so no copy follows unless for another reason), when the application nacks it while
// the gate holds no copy of it (it asked for the broker's copy), or when the cursor moves (seek,
// Stop). Not when a copy arrives: each reconnect while the message is held sends one more, and a
// copy taken before the next reconnect stays in the gate's channel. Guarded by the gate's lock.
type redeliveryFilter struct {
	ids   map[idKey]struct{}
	order []idKey // insertion order, for the bound
}

func (f *redeliveryFilter) empty() bool { return len(f.ids) == 0 }

func (f *redeliveryFilter) remember(id pulsar.MessageID) {
	if f.ids == nil {
		f.ids = map[idKey]struct{}{}
	}
	k := keyOf(id)
	if _, ok := f.ids[k]; ok {
		return
	}
	for len(f.ids) >= maxRemembered && len(f.order) > 0 {
		delete(f.ids, f.order[0])
		f.order = f.order[1:]
	}
	f.ids[k] = struct{}{}
	f.order = append(f.order, k)
}

// seenAgain reports whether id is the broker's copy of a remembered message; otherwise it ends
// the entries of the earlier messages of its partition.
func (f *redeliveryFilter) seenAgain(id pulsar.MessageID) bool {
	if len(f.ids) == 0 {
		return false
	}
	if f.copyOf(id) {
		return true
	}
	k := keyOf(id)
	f.drop(func(o idKey) bool { return o.partition == k.partition && k.after(o) })
	return false
}

// copyOf reports whether id is the copy of a remembered message.
func (f *redeliveryFilter) copyOf(id pulsar.MessageID) bool {
	_, ok := f.ids[keyOf(id)]
	return ok
}

// forgetID ends the entry of id (the application nacked it: the copy is wanted).
func (f *redeliveryFilter) forgetID(id pulsar.MessageID) {
	if len(f.ids) == 0 {
		return
	}
	k := keyOf(id)
	f.drop(func(o idKey) bool { return o == k })
}

// forget ends every entry (the cursor moved).
func (f *redeliveryFilter) forget() {
	f.ids, f.order = nil, nil
}

func (f *redeliveryFilter) drop(match func(idKey) bool) {
	kept := f.order[:0]
	for _, k := range f.order {
		if match(k) {
			delete(f.ids, k)
			continue
		}
		kept = append(kept, k)
	}
	clear(f.order[len(kept):])
	f.order = kept
}
