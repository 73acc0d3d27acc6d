package pulsartest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// adminHandler serves the subset of the admin REST API (v2, persistent
// topics) that subflow uses, with Pulsar's paths and JSON shapes.
func (b *Broker) adminHandler() http.Handler {
	const topicPath = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
	mux := http.NewServeMux()
	owned := func(pattern string, h http.HandlerFunc) { mux.HandleFunc(pattern, b.ownedTopic(h)) }
	owned("GET "+topicPath+"/internalStats", b.withTopic(b.internalStats))
	owned("GET "+topicPath+"/ledger/{ledger}/entry/{entry}", b.withTopic(b.messageByID))
	owned("GET "+topicPath+"/getMessageIdByIndex", b.messageIDByIndex)
	owned("POST "+topicPath+"/subscription/{sub}/resetcursor", b.resetCursorToID)
	owned("POST "+topicPath+"/subscription/{sub}/resetcursor/{timestamp}", b.resetCursorToTime)
	owned("GET "+topicPath+"/stats", b.topicStats)
	owned("PUT "+topicPath, b.createTopic)
	owned("PUT "+topicPath+"/unload", b.unloadTopic)
	owned("POST "+topicPath+"/subscription/{sub}/expireMessages/{seconds}", b.expireMessages)
	owned("POST "+topicPath+"/all_subscription/expireMessages/{seconds}", b.expireMessages)
	owned("POST "+topicPath+"/terminate", b.terminateTopic)
	// partitioned-stats and partition metadata are answered by any broker.
	mux.HandleFunc("GET "+topicPath+"/partitioned-stats", b.partitionedStats)
	mux.HandleFunc("PUT "+topicPath+"/partitions", b.createPartitions)
	mux.HandleFunc("POST "+topicPath+"/partitions", b.updatePartitions)
	mux.HandleFunc("GET "+topicPath+"/partitions", b.partitionMetadata)
	mux.HandleFunc("DELETE "+topicPath+"/partitions", b.deletePartitions)
	b.policyRoutes(mux, owned)
	return b.authenticated(mux)
}

func fullFromPath(r *http.Request) string {
	return "persistent://" + r.PathValue("tenant") + "/" + r.PathValue("namespace") + "/" + r.PathValue("topic")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeReason answers an error the way Pulsar's REST layer does.
func writeReason(w http.ResponseWriter, status int, reason string) {
	writeJSON(w, status, map[string]string{"reason": reason})
}

// withTopic resolves one existing non-partitioned topic or partition.
func (b *Broker) withTopic(h func(http.ResponseWriter, *http.Request, *topic)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		t := b.getTopic(fullFromPath(r), false)
		if t == nil {
			writeReason(w, http.StatusNotFound, "Topic not found")
			return
		}
		h(w, r, t)
	}
}

func position(ledgerID uint64, entryID int64) string {
	return fmt.Sprintf("%d:%d", ledgerID, entryID)
}

// positionBefore is the position just before offset off, as markDelete
// positions are written.
func (t *topic) positionBefore(off int) string {
	if off > 0 {
		e := t.entries[off-1]
		return position(e.ledgerID, int64(e.entryID))
	}
	if len(t.ledgers) > 0 {
		return position(t.ledgers[0].id, -1)
	}
	return position(0, -1)
}

func (t *topic) positionAt(off int) string {
	if off < len(t.entries) {
		return position(t.entries[off].ledgerID, int64(t.entries[off].entryID))
	}
	if len(t.ledgers) == 0 {
		return position(0, 0)
	}
	l := t.ledgers[len(t.ledgers)-1]
	return position(l.id, int64(l.entries))
}

type ledgerJSON struct {
	LedgerID        uint64 `json:"ledgerId"`
	Entries         int64  `json:"entries"`
	Size            int64  `json:"size"`
	Timestamp       *int64 `json:"timestamp,omitempty"` // set when a rollover closed the ledger
	Offloaded       bool   `json:"offloaded"`
	UnderReplicated bool   `json:"underReplicated"`
}

type cursorJSON struct {
	MarkDeletePosition                       string            `json:"markDeletePosition"`
	ReadPosition                             string            `json:"readPosition"`
	WaitingReadOp                            bool              `json:"waitingReadOp"`
	PendingReadOps                           int               `json:"pendingReadOps"`
	MessagesConsumedCounter                  int64             `json:"messagesConsumedCounter"`
	CursorLedger                             int64             `json:"cursorLedger"`
	CursorLedgerLastEntry                    int64             `json:"cursorLedgerLastEntry"`
	IndividuallyDeletedMessages              string            `json:"individuallyDeletedMessages"`
	State                                    string            `json:"state"`
	Active                                   bool              `json:"active"`
	NumberOfEntriesSinceFirstNotAckedMessage int64             `json:"numberOfEntriesSinceFirstNotAckedMessage"`
	TotalNonContiguousDeletedMessagesRange   int               `json:"totalNonContiguousDeletedMessagesRange"`
	LastLedgerSwitchTimestamp                string            `json:"lastLedgerSwitchTimestamp"`
	SubscriptionHavePendingRead              bool              `json:"subscriptionHavePendingRead"`
	SubscriptionHavePendingReplayRead        bool              `json:"subscriptionHavePendingReplayRead"`
	Properties                               map[string]string `json:"properties"`
}

type internalStatsJSON struct {
	EntriesAddedCounter        int64                 `json:"entriesAddedCounter"`
	NumberOfEntries            int64                 `json:"numberOfEntries"`
	TotalSize                  int64                 `json:"totalSize"`
	CurrentLedgerEntries       int64                 `json:"currentLedgerEntries"`
	CurrentLedgerSize          int64                 `json:"currentLedgerSize"`
	LastLedgerCreatedTimestamp string                `json:"lastLedgerCreatedTimestamp"`
	WaitingCursorsCount        int                   `json:"waitingCursorsCount"`
	PendingAddEntriesCount     int                   `json:"pendingAddEntriesCount"`
	LastConfirmedEntry         string                `json:"lastConfirmedEntry"`
	State                      string                `json:"state"`
	Ledgers                    []ledgerJSON          `json:"ledgers"`
	Cursors                    map[string]cursorJSON `json:"cursors"`
	Properties                 map[string]string     `json:"properties"`
	SchemaLedgers              []ledgerJSON          `json:"schemaLedgers"`
	CompactedLedger            compactedLedgerJSON   `json:"compactedLedger"`
}

// compactedLedgerJSON is the compactedLedger of internal stats: -1 until a
// compaction ran (never here).
type compactedLedgerJSON struct {
	LedgerID        int64 `json:"ledgerId"`
	Entries         int64 `json:"entries"`
	Size            int64 `json:"size"`
	Offloaded       bool  `json:"offloaded"`
	UnderReplicated bool  `json:"underReplicated"`
}

// statsTime is how internal stats write times: DateFormatter.format, as
// the entry headers.
func statsTime(t time.Time) string { return javaDate(t.UnixMilli()) }

// internalStats mirrors PersistentTopicInternalStats. As in Pulsar, the
// open (last) ledger lists 0 entries; its count is currentLedgerEntries. A
// ledger shows its timestamp only once a rollover closed it. properties
// holds the broker-entry index as the AppendIndexMetadataInterceptor last
// stored it in the managed ledger's properties, when the current ledger was
// opened.
func (b *Broker) internalStats(w http.ResponseWriter, _ *http.Request, t *topic) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := internalStatsJSON{
		EntriesAddedCounter: int64(len(t.entries)),
		NumberOfEntries:     int64(len(t.entries)),
		TotalSize:           t.size,
		LastConfirmedEntry:  t.positionBefore(len(t.entries)),
		State:               "LedgerOpened",
		Ledgers:             []ledgerJSON{},
		Cursors:             map[string]cursorJSON{},
		Properties:          map[string]string{},
		SchemaLedgers:       []ledgerJSON{},
		CompactedLedger:     compactedLedgerJSON{LedgerID: -1, Entries: -1, Size: -1},
	}
	if !b.opts.DisableIndexMetadata {
		out.Properties["index"] = strconv.FormatInt(t.indexAtLedgerOpen, 10)
	}
	for i, l := range t.ledgers {
		lj := ledgerJSON{LedgerID: l.id, Entries: int64(l.entries), Size: l.size}
		if !l.closed.IsZero() {
			lj.Timestamp = ptr(l.closed.UnixMilli())
		}
		if i == len(t.ledgers)-1 {
			out.CurrentLedgerEntries, out.CurrentLedgerSize = lj.Entries, lj.Size
			out.LastLedgerCreatedTimestamp = statsTime(l.created)
			lj.Entries, lj.Size = 0, 0
		}
		out.Ledgers = append(out.Ledgers, lj)
	}
	for name, s := range t.subs {
		if !s.durable {
			continue
		}
		waiting := s.waitingForEntries()
		if waiting {
			out.WaitingCursorsCount++
		}
		ranges, deleted := s.individuallyDeleted()
		out.Cursors[name] = cursorJSON{
			MarkDeletePosition:      t.positionBefore(s.markDelete),
			ReadPosition:            t.positionAt(s.readPos),
			WaitingReadOp:           waiting,
			MessagesConsumedCounter: s.ackedMsgs,
			// The cursor's own BookKeeper ledger, where mark-delete
			// positions are persisted, is not modelled.
			CursorLedger:                -1,
			CursorLedgerLastEntry:       -1,
			IndividuallyDeletedMessages: deleted,
			State:                       "Open",
			Active:                      len(s.consumers) > 0,
			// ManagedCursorImpl.getNumberOfEntriesSinceFirstNotAckedMessage:
			// the positions in (markDeletePosition, readPosition].
			NumberOfEntriesSinceFirstNotAckedMessage: int64(s.readPos - s.markDelete + 1),
			TotalNonContiguousDeletedMessagesRange:   ranges,
			LastLedgerSwitchTimestamp:                statsTime(s.created),
			SubscriptionHavePendingRead:              waiting,
			Properties:                               map[string]string{},
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// individuallyDeleted writes the acknowledged entries past the mark-delete
// position as ManagedCursorImpl's range set prints them:
// "[(l:e..l:e], ...]", each range open at the entry before its first.
func (s *subscription) individuallyDeleted() (int, string) {
	offs := make([]int, 0, len(s.acked))
	for off := range s.acked {
		offs = append(offs, off)
	}
	sort.Ints(offs)
	var parts []string
	for i := 0; i < len(offs); {
		j := i
		for j+1 < len(offs) && offs[j+1] == offs[j]+1 {
			j++
		}
		lo, hi := s.t.entries[offs[i]-1], s.t.entries[offs[j]]
		parts = append(parts, fmt.Sprintf("(%s..%s]", position(lo.ledgerID, int64(lo.entryID)), position(hi.ledgerID, int64(hi.entryID))))
		i = j + 1
	}
	return len(parts), "[" + strings.Join(parts, ", ") + "]"
}

// messageByID answers like Pulsar's get-message-by-id
// (PersistentTopicsBase.generateResponseWithEntry): the payload (a whole
// batch for batched entries) as the body and the metadata as headers. An
// entry past the end of the current ledger is a read past its
// LastConfirmedEntry: 500; any other unknown position answers 404.
func (b *Broker) messageByID(w http.ResponseWriter, r *http.Request, t *topic) {
	ledgerID, err1 := strconv.ParseUint(r.PathValue("ledger"), 10, 64)
	entryID, err2 := strconv.ParseUint(r.PathValue("entry"), 10, 64)
	if err1 != nil || err2 != nil {
		writeReason(w, http.StatusBadRequest, "invalid ledger or entry id")
		return
	}
	t.mu.Lock()
	off, ok := t.offsetOf(ledgerID, entryID)
	var e *entry
	if ok {
		e = t.entries[off]
	}
	current := t.ledgers[len(t.ledgers)-1]
	lac := t.positionBefore(len(t.entries))
	t.mu.Unlock()
	if e == nil {
		if ledgerID == current.id {
			writeReason(w, http.StatusInternalServerError, fmt.Sprintf("\n --- An unexpected error occurred in the server ---\n\nMessage: LastConfirmedEntry is %s when reading entry %d\n", lac, entryID))
			return
		}
		writeReason(w, http.StatusNotFound, "Message id not found")
		return
	}
	h := w.Header()
	set := func(k, v string) { h[k] = []string{v} } // Pulsar's spelling, not canonicalised
	set("Content-Type", "application/json")
	set("X-Pulsar-Message-ID", position(e.ledgerID, int64(e.entryID)))
	set("X-Pulsar-publish-time", javaDate(e.publishTime))
	set("X-Pulsar-producer-name", e.meta.GetProducerName())
	set("X-Pulsar-sequence-id", strconv.FormatUint(e.meta.GetSequenceId(), 10))
	if e.meta.PartitionKey != nil {
		set("X-Pulsar-partition-key", e.meta.GetPartitionKey())
	}
	if e.meta.Uuid != nil { // a chunk of a chunked message (PersistentTopicsBase)
		set("X-Pulsar-uuid", e.meta.GetUuid())
		set("X-Pulsar-num-chunks-from-msg", strconv.Itoa(int(e.meta.GetNumChunksFromMsg())))
		set("X-Pulsar-total-chunk-msg-size", strconv.Itoa(int(e.meta.GetTotalChunkMsgSize())))
		set("X-Pulsar-chunk-id", strconv.Itoa(int(e.meta.GetChunkId())))
	}
	if e.meta.NumMessagesInBatch != nil {
		set("X-Pulsar-num-batch-message", strconv.Itoa(int(e.messages)))
		// The stored entry's bytes, broker-entry section included, less
		// the message metadata.
		set("X-Pulsar-batch-size", strconv.Itoa(len(e.brokerMeta)+len(e.data)-proto.Size(e.meta)))
	}
	uncompressed := len(e.payload)
	if e.meta.UncompressedSize != nil {
		uncompressed = int(e.meta.GetUncompressedSize())
	}
	set("X-Pulsar-uncompressed-size", strconv.Itoa(uncompressed))
	set("X-Pulsar-Is-Encrypted", "false") // encryption is not modelled
	set("X-Pulsar-txn-uncommitted", "false")
	props := map[string]string{}
	for _, kv := range e.meta.GetProperties() {
		props[kv.GetKey()] = kv.GetValue()
	}
	propsJSON, _ := json.Marshal(props)
	set("X-Pulsar-PROPERTY", string(propsJSON))
	set("X-Pulsar-Broker-Entry-METADATA-timestamp", javaDate(e.brokerTime))
	if !b.opts.DisableIndexMetadata {
		set("X-Pulsar-Broker-Entry-METADATA-index", strconv.FormatInt(e.lastIndex, 10))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(e.payload)
}

// javaDate is DateFormatter.format of the entry headers:
// ISO_OFFSET_DATE_TIME (UTC here), the fraction without trailing zeros.
func javaDate(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.999999999Z07:00")
}

// messageIDJSON is MessageIdImpl as the admin API writes it: what PIP-415
// getMessageIdByIndex answers (batch fields always -1 and 0), and terminate.
type messageIDJSON struct {
	LedgerID       int64 `json:"ledgerId"`
	EntryID        int64 `json:"entryId"`
	PartitionIndex int32 `json:"partitionIndex"`
	BatchIndex     int32 `json:"batchIndex"`
	BatchSize      int32 `json:"batchSize"`
}

// resetCursorDataJSON is ResetCursorData, the body of resetcursor: the
// flags are body fields, not query parameters. The Java class is a Lombok
// bean, so its isExcluded field is "excluded" in JSON; Jackson ignores
// unknown fields, so "isExcluded" changes nothing, as on the real broker.
type resetCursorDataJSON struct {
	LedgerID       int64 `json:"ledgerId"`
	EntryID        int64 `json:"entryId"`
	PartitionIndex int32 `json:"partitionIndex"`
	Excluded       bool  `json:"excluded"`
	BatchIndex     int32 `json:"batchIndex"`
}

// messageIDByIndex is PIP-415: the id of the entry holding the message with
// that broker-entry index (the first one after it when the index is gone).
func (b *Broker) messageIDByIndex(w http.ResponseWriter, r *http.Request) {
	if b.opts.DisableIndexLookup {
		http.NotFound(w, r) // the endpoint does not exist before PIP-415
		return
	}
	if b.opts.DisableIndexMetadata {
		writeReason(w, http.StatusPreconditionFailed, "Broker entry metadata is not enabled")
		return
	}
	index, err := strconv.ParseInt(r.URL.Query().Get("index"), 10, 64)
	if err != nil || index < 0 {
		writeReason(w, http.StatusBadRequest, "index must be a non-negative integer")
		return
	}
	full := fullFromPath(r)
	if b.partitionsOf(full) > 0 {
		writeReason(w, http.StatusMethodNotAllowed, "GetMessageIDByIndex is not allowed on partitioned-topic")
		return
	}
	t := b.getTopic(full, false)
	if t == nil {
		writeReason(w, http.StatusNotFound, fmt.Sprintf("Topic %s not found", full))
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.entries) == 0 {
		writeReason(w, http.StatusNotFound, fmt.Sprintf("No messages found in topic %s", full))
		return
	}
	off := sort.Search(len(t.entries), func(i int) bool { return t.entries[i].lastIndex >= index })
	if off == len(t.entries) {
		writeReason(w, http.StatusNotFound, fmt.Sprintf("Message with index %d not found", index))
		return
	}
	e := t.entries[off]
	id := messageIDJSON{LedgerID: int64(e.ledgerID), EntryID: int64(e.entryID), PartitionIndex: t.partition, BatchIndex: -1}
	if off == 0 && index < e.lastIndex {
		// Pulsar 4.2 answers -1:-1 for an index of the first entry other than its last: it
		// looks for the entry after the last one whose index is below the one asked for.
		id.LedgerID, id.EntryID = -1, -1
	}
	writeJSON(w, http.StatusOK, id)
}

// resetTargets resolves the topics a reset applies to: the topic, or the
// partition named by partitionIndex, or all partitions when it is -1.
func (b *Broker) resetTargets(r *http.Request, partition int32) []*topic {
	full := fullFromPath(r)
	if n := b.partitionsOf(full); n > 0 {
		if partition >= 0 && int(partition) < n {
			return []*topic{b.getTopic(partitionName(full, int(partition)), true)}
		}
		return b.topicsNamed(full)
	}
	if t := b.getTopic(full, false); t != nil {
		return []*topic{t}
	}
	return nil
}

// resetCursorToID is internalResetCursorOnPosition: a partitioned topic's
// base name answers 405, a partition or non-partitioned topic resets.
func (b *Broker) resetCursorToID(w http.ResponseWriter, r *http.Request) {
	if b.partitionsOf(fullFromPath(r)) > 0 {
		writeReason(w, http.StatusMethodNotAllowed, "Reset-cursor at position is not allowed for partitioned-topic")
		return
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	id := resetCursorDataJSON{PartitionIndex: -1, BatchIndex: -1}
	if err := json.Unmarshal(body, &id); err != nil {
		writeReason(w, http.StatusBadRequest, "invalid message id: "+err.Error())
		return
	}
	b.resetCursor(w, r, -1, func(t *topic) int {
		off := t.offsetForStart(&pb.MessageIdData{LedgerId: ptr(uint64(id.LedgerID)), EntryId: ptr(uint64(id.EntryID))})
		if id.Excluded && off < len(t.entries) && t.entries[off].ledgerID == uint64(id.LedgerID) && t.entries[off].entryID == uint64(id.EntryID) {
			off++
		}
		return off
	})
}

func (b *Broker) resetCursorToTime(w http.ResponseWriter, r *http.Request) {
	ms, err := strconv.ParseInt(r.PathValue("timestamp"), 10, 64)
	if err != nil {
		writeReason(w, http.StatusBadRequest, "invalid timestamp")
		return
	}
	b.resetCursor(w, r, -1, func(t *topic) int { return t.offsetForTime(ms) })
}

func (b *Broker) resetCursor(w http.ResponseWriter, r *http.Request, partition int32, target func(*topic) int) {
	topics := b.resetTargets(r, partition)
	if len(topics) == 0 {
		writeReason(w, http.StatusNotFound, "Topic not found")
		return
	}
	name := r.PathValue("sub")
	found := false
	var closed []*conn
	for _, t := range topics {
		t.mu.Lock()
		if s := t.subs[name]; s != nil {
			found = true
			closed = append(closed, s.resetCursor(target(t))...)
		}
		t.mu.Unlock()
	}
	if !found {
		writeReason(w, http.StatusNotFound, "Subscription not found")
		return
	}
	// PersistentSubscription.resetCursor completes after the consumers'
	// disconnection, whose CLOSE_CONSUMER frames are written by then.
	awaitFlushed(closed)
	w.WriteHeader(http.StatusNoContent)
}

func ptr[T any](v T) *T { return &v }

type consumerStatsJSON struct {
	ConsumerName                 string `json:"consumerName"`
	AvailablePermits             int64  `json:"availablePermits"`
	UnackedMessages              int64  `json:"unackedMessages"`
	MsgOutCounter                int64  `json:"msgOutCounter"`
	AvgMessagesPerEntry          int64  `json:"avgMessagesPerEntry"`
	BlockedConsumerOnUnackedMsgs bool   `json:"blockedConsumerOnUnackedMsgs"`
	Address                      string `json:"address"`
	// As for publishers, only in a topic's own stats (ConsumerStatsImpl.add drops them).
	ClientVersion string             `json:"clientVersion,omitempty"`
	Metadata      *map[string]string `json:"metadata,omitempty"`
}

type subscriptionStatsJSON struct {
	MsgOutCounter                   int64               `json:"msgOutCounter"`
	MsgBacklog                      int64               `json:"msgBacklog"`
	BacklogSize                     int64               `json:"backlogSize"`
	EarliestMsgPublishTimeInBacklog int64               `json:"earliestMsgPublishTimeInBacklog"`
	TotalMsgExpired                 int64               `json:"totalMsgExpired"`
	LastExpireTimestamp             int64               `json:"lastExpireTimestamp"`
	UnackedMessages                 int64               `json:"unackedMessages"`
	MsgInReplay                     int64               `json:"msgInReplay"`
	Type                            string              `json:"type"`
	ActiveConsumerName              string              `json:"activeConsumerName,omitempty"`
	IsDurable                       bool                `json:"isDurable"`
	Consumers                       []consumerStatsJSON `json:"consumers"`
}

// publisherJSON is PublisherStats; metadata and clientVersion are only in a topic's own
// stats, not in partitioned-stats' aggregate (PublisherStatsImpl.add drops them).
type publisherJSON struct {
	ProducerID    uint64             `json:"producerId"`
	ProducerName  string             `json:"producerName"`
	Address       string             `json:"address"`
	ClientVersion string             `json:"clientVersion,omitempty"`
	Metadata      *map[string]string `json:"metadata,omitempty"`
}

type topicStatsJSON struct {
	MsgInCounter                     int64                            `json:"msgInCounter"`
	MsgOutCounter                    int64                            `json:"msgOutCounter"`
	StorageSize                      int64                            `json:"storageSize"`
	BacklogSize                      int64                            `json:"backlogSize"`
	EarliestMsgPublishTimeInBacklogs int64                            `json:"earliestMsgPublishTimeInBacklogs"`
	Publishers                       []publisherJSON                  `json:"publishers"`
	Subscriptions                    map[string]subscriptionStatsJSON `json:"subscriptions"`
	// Partitions is partitioned-stats' per-partition map (perPartition, true by default).
	Partitions map[string]topicStatsJSON `json:"partitions,omitempty"`
}

// statsMetadata is a copy of a producer's or consumer's metadata for its stats: {} when it
// has none.
func statsMetadata(m map[string]string) *map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return &out
}

// topicStats mirrors TopicStats of one topic or partition; a partitioned
// topic's base name has no topic of its own (404), as in Pulsar.
func (b *Broker) topicStats(w http.ResponseWriter, r *http.Request) {
	if b.partitionsOf(fullFromPath(r)) > 0 {
		writeReason(w, http.StatusNotFound, "Topic not found")
		return
	}
	b.partitionedStats(w, r)
}

// partitionedStats aggregates the partitions of a partitioned topic (or
// answers for one topic). As in PersistentTopics.getStats, backlogSize is
// the estimated backlog (subscriptionBacklogSize defaults to true) and the
// earliest publish times are computed only when getEarliestTimeInBacklog=true.
func (b *Broker) partitionedStats(w http.ResponseWriter, r *http.Request) {
	earliest := r.URL.Query().Get("getEarliestTimeInBacklog") == "true"
	full := fullFromPath(r)
	topics := b.topicsNamed(full)
	if len(topics) == 0 {
		writeReason(w, http.StatusNotFound, "Topic not found")
		return
	}
	if b.partitionsOf(full) == 0 {
		writeJSON(w, http.StatusOK, statsOf(topics, earliest, true))
		return
	}
	out := statsOf(topics, earliest, false)
	if r.URL.Query().Get("perPartition") != "false" {
		out.Partitions = map[string]topicStatsJSON{}
		for _, t := range topics {
			out.Partitions[t.name.full] = statsOf([]*topic{t}, earliest, true)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// statsOf sums the stats of topics (the partitions of one partitioned topic, or one topic);
// detail adds what only a topic's own stats show.
func statsOf(topics []*topic, earliest, detail bool) topicStatsJSON {
	out := topicStatsJSON{Publishers: []publisherJSON{}, Subscriptions: map[string]subscriptionStatsJSON{}}
	for _, t := range topics {
		t.mu.Lock()
		out.MsgInCounter += t.msgIn
		out.StorageSize += t.size
		out.BacklogSize += t.estimatedBacklogSize()
		for p := range t.producers {
			pj := publisherJSON{ProducerID: p.id, ProducerName: p.name, Address: p.conn.nc.RemoteAddr().String()}
			if detail {
				pj.ClientVersion, pj.Metadata = p.conn.clientVersion, statsMetadata(p.metadata)
			}
			out.Publishers = append(out.Publishers, pj)
		}
		for name, s := range t.subs {
			ss := out.Subscriptions[name]
			ss.Type, ss.IsDurable = subTypeName(s.kind), s.durable
			ss.MsgOutCounter += s.dispatched
			ss.MsgBacklog += s.backlog()
			ss.MsgInReplay += int64(len(s.replay)) // redeliveryMessages.size(), entries
			ss.BacklogSize += t.sizeFrom(s.markDelete)
			ss.TotalMsgExpired += s.expired
			ss.LastExpireTimestamp = max(ss.LastExpireTimestamp, s.lastExpire)
			if earliest {
				p := s.earliestPublishTime()
				ss.EarliestMsgPublishTimeInBacklog = earliestOf(ss.EarliestMsgPublishTimeInBacklog, p)
				out.EarliestMsgPublishTimeInBacklogs = earliestOf(out.EarliestMsgPublishTimeInBacklogs, p)
			}
			if s.active != nil && !s.individualAck() {
				ss.ActiveConsumerName = s.active.name
			}
			out.MsgOutCounter += s.dispatched
			for _, c := range s.consumers {
				// Consumer.addAndGetUnAckedMsgs counts only in individual
				// ack mode: Exclusive and Failover consumers report 0.
				unacked := c.unackedMsgs
				if !s.individualAck() {
					unacked = 0
				}
				ss.UnackedMessages += unacked
				cj := consumerStatsJSON{
					ConsumerName: c.name, AvailablePermits: c.permits, UnackedMessages: unacked,
					MsgOutCounter: c.dispatched, AvgMessagesPerEntry: 1, Address: c.conn.nc.RemoteAddr().String(), BlockedConsumerOnUnackedMsgs: c.blocked,
				}
				if detail {
					cj.ClientVersion, cj.Metadata = c.conn.clientVersion, statsMetadata(c.metadata)
				}
				ss.Consumers = append(ss.Consumers, cj)
			}
			if ss.Consumers == nil {
				ss.Consumers = []consumerStatsJSON{}
			}
			out.Subscriptions[name] = ss
		}
		t.mu.Unlock()
	}
	return out
}

func subTypeName(k subType) string { return k.String() }

// earliestOf keeps the earlier of two publish times, where 0 means none
// seen yet and -1 an empty backlog (as the broker reports it).
func earliestOf(a, b int64) int64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	case a > 0 && b > 0:
		return min(a, b)
	}
	return max(a, b) // a time beats -1
}

// createPartitions is PersistentTopics.createPartitionedTopic, whose body is the number of
// partitions, and ExtPersistentTopics.createPartitionedTopic, which pulsaradmin calls with a
// PartitionedTopicMetadata body {"partitions": N, "properties": {...}} of media type
// application/vnd.partitioned-topic-metadata+json: 406 unless N is positive, 409 when the
// name is taken.
func (b *Broker) createPartitions(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	var meta struct {
		Partitions int               `json:"partitions"`
		Properties map[string]string `json:"properties"`
	}
	var err error
	if strings.HasPrefix(r.Header.Get("Content-Type"), partitionedTopicMetadataType) {
		err = json.Unmarshal(body, &meta)
	} else {
		meta.Partitions, err = strconv.Atoi(strings.TrimSpace(string(body)))
	}
	switch {
	case err != nil:
		writeReason(w, http.StatusBadRequest, "body must be the number of partitions")
		return
	case meta.Partitions <= 0:
		writeReason(w, http.StatusNotAcceptable, "Number of partitions should be more than 0")
		return
	}
	full := fullFromPath(r)
	if err := b.CreatePartitionedTopic(full, meta.Partitions); err != nil {
		writeReason(w, http.StatusConflict, "This topic already exists")
		return
	}
	if meta.Properties != nil {
		b.st.mu.Lock()
		b.st.partitionProps[full] = meta.Properties
		b.st.mu.Unlock()
	}
	w.WriteHeader(http.StatusNoContent)
}

// partitionedTopicMetadataType is PartitionedTopicMetadata.MEDIA_TYPE.
const partitionedTopicMetadataType = "application/vnd.partitioned-topic-metadata+json"

// updatePartitions is PersistentTopicsBase.internalUpdatePartitionedTopicAsync
// (POST .../partitions, body the new count): 406 unless positive, 409 when
// the topic is not partitioned or would not grow, else 204.
func (b *Broker) updatePartitions(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<10))
	n, err := strconv.Atoi(strings.TrimSpace(string(body)))
	switch {
	case err != nil:
		writeReason(w, http.StatusBadRequest, "body must be the number of partitions")
		return
	case n <= 0:
		writeReason(w, http.StatusNotAcceptable, "Number of partitions should be more than 0")
		return
	}
	full := fullFromPath(r)
	old := b.partitionsOf(full)
	switch {
	case old == 0:
		writeReason(w, http.StatusConflict, "Partitioned topic does not exist")
		return
	case n <= old:
		writeReason(w, http.StatusConflict, "Number of new partitions must be greater than existing number of partitions")
		return
	}
	if err := b.UpdatePartitionedTopic(full, n); err != nil {
		writeReason(w, http.StatusConflict, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// partitionMetadata is PersistentTopics.getPartitionedMetadata: {partitions: 0} for a
// non-partitioned topic; 404 "Topic ... not found" for a topic that does not exist, unless
// the caller passes checkAllowAutoCreation=true, as clients about to create it do.
func (b *Broker) partitionMetadata(w http.ResponseWriter, r *http.Request) {
	full := fullFromPath(r)
	b.st.mu.Lock()
	n, partitioned := b.st.partitioned[full]
	out := partitionedTopicMetadataJSON{Partitions: n, Properties: b.st.partitionProps[full]}
	_, exists := b.st.topics[full]
	if tn, err := parseTopic(full); err == nil && tn.partition >= 0 {
		exists = exists || tn.partition < b.st.partitioned[tn.base()]
	}
	b.st.mu.Unlock()
	// PersistentTopicsBase.internalGetPartitionedMetadataAsync: no partitions, and the topic
	// must exist unless checkAllowAutoCreation=true (allowAutoTopicCreation is on here).
	if !partitioned && !exists && r.URL.Query().Get("checkAllowAutoCreation") != "true" {
		writeReason(w, http.StatusNotFound, "Topic "+full+" not found")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// partitionedTopicMetadataJSON is PartitionedTopicMetadata as the broker
// writes it: properties are omitted when null, "deleted" is always there.
type partitionedTopicMetadataJSON struct {
	Partitions int               `json:"partitions"`
	Deleted    bool              `json:"deleted"`
	Properties map[string]string `json:"properties,omitempty"`
}

// deletePartitions is PersistentTopics.deletePartitionedTopic: 404 for a name that is not
// a partitioned topic; without force, 412 while a partition has a producer or a consumer;
// else the partitions (force closes their clients) and the metadata go.
func (b *Broker) deletePartitions(w http.ResponseWriter, r *http.Request) {
	full := fullFromPath(r)
	if b.partitionsOf(full) == 0 {
		writeReason(w, http.StatusNotFound, "Partitioned topic does not exist")
		return
	}
	force := r.URL.Query().Get("force") == "true"
	topics := b.topicsNamed(full)
	if !force {
		for _, t := range topics {
			if t.connected() {
				writeReason(w, http.StatusPreconditionFailed, "Topic has active producers/subscriptions")
				return
			}
		}
	}
	for _, t := range topics {
		t.unload()
	}
	b.st.mu.Lock()
	for _, t := range topics {
		delete(b.st.topics, t.name.full)
	}
	delete(b.st.partitioned, full)
	delete(b.st.partitionProps, full)
	b.st.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// terminateTopic is PersistentTopics.terminate: the topic's last message id, as MessageIdImpl
// writes it; 405 on a partitioned topic's base name, 404 for an unknown topic.
func (b *Broker) terminateTopic(w http.ResponseWriter, r *http.Request) {
	full := fullFromPath(r)
	if b.partitionsOf(full) > 0 {
		writeReason(w, http.StatusMethodNotAllowed, "Termination of a partitioned topic is not allowed")
		return
	}
	t := b.getTopic(full, false)
	if t == nil {
		writeReason(w, http.StatusNotFound, "Topic not found")
		return
	}
	id := t.terminate()
	writeJSON(w, http.StatusOK, messageIDJSON{
		LedgerID: int64(id.GetLedgerId()), EntryID: int64(id.GetEntryId()), PartitionIndex: -1, BatchIndex: -1,
	})
}

// createTopic is PersistentTopics.createNonPartitionedTopic: the topic is
// created (its first ledger opened), 409 when the name is taken by a topic
// or a partitioned topic.
func (b *Broker) createTopic(w http.ResponseWriter, r *http.Request) {
	full := fullFromPath(r)
	if _, err := parseTopic(full); err != nil {
		writeReason(w, http.StatusPreconditionFailed, err.Error())
		return
	}
	b.st.mu.Lock()
	_, partitioned := b.st.partitioned[full]
	_, exists := b.st.topics[full]
	b.st.mu.Unlock()
	if partitioned || exists {
		writeReason(w, http.StatusConflict, "This topic already exists")
		return
	}
	b.getTopic(full, true)
	w.WriteHeader(http.StatusNoContent)
}

// unloadTopic is PersistentTopics.unloadTopic: the topic (every partition
// of a partitioned one) closes its producers and consumers, which look it
// up again.
func (b *Broker) unloadTopic(w http.ResponseWriter, r *http.Request) {
	full := fullFromPath(r)
	if err := b.UnloadTopic(full); err != nil {
		writeReason(w, http.StatusNotFound, fmt.Sprintf("Topic %s not found", full))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// expireMessages is PersistentTopics.expireTopicMessages (one subscription,
// or all_subscription): the subscription's PersistentMessageExpiryMonitor
// runs at once with the given TTL, as the periodic message-TTL check does
// with the applied messageTTL.
func (b *Broker) expireMessages(w http.ResponseWriter, r *http.Request) {
	seconds, err := strconv.Atoi(r.PathValue("seconds"))
	if err != nil || seconds < 0 {
		writeReason(w, http.StatusBadRequest, "expire time must be a non-negative number of seconds")
		return
	}
	full := fullFromPath(r)
	topics := b.topicsNamed(full)
	if len(topics) == 0 {
		writeReason(w, http.StatusNotFound, fmt.Sprintf("Topic %s not found", full))
		return
	}
	name := r.PathValue("sub")
	found := false
	now := b.now()
	for _, t := range topics {
		t.mu.Lock()
		for subName, s := range t.subs {
			if name == "" || subName == name {
				found = true
				s.expire(now, time.Duration(seconds)*time.Second)
			}
		}
		t.mu.Unlock()
	}
	if !found && name != "" {
		writeReason(w, http.StatusNotFound, "Subscription not found")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
