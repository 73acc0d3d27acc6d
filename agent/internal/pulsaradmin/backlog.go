package pulsaradmin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// backlogReadTimeout bounds one whole read (every partition) of a subscription's backlog.
const backlogReadTimeout = 10 * time.Second

// Backlog reads, through the admin API with the application's credentials, the subscription's
// backlog on the topic (one entry per partition of a partitioned topic) and the retention
// policies that may delete it while nobody consumes: the effective message TTL and backlog
// quotas. It never fails: what cannot be read (no admin URL, credentials refused, topic or
// subscription missing, broker unreachable) comes back as an entry whose Unknown says why.
// Every entry names the subscription.
//
// Rights needed with Pulsar's default authorization provider: partition metadata and topic
// stats need lookup (produce or consume) permission on the topic; the applied message TTL and
// backlog quotas are topic policies, which need tenant admin rights. An application with
// consume rights only gets the backlog with RetentionUnknown naming the refused read.
func (a *Client) Backlog(ctx context.Context, topic, subscription string) []protocol.BacklogStatus {
	now := time.Now()
	if a == nil {
		return []protocol.BacklogStatus{unknownBacklog(topic, subscription, now, "no admin URL is set (the agent's Options.AdminURL, the sidecar's --admin-url)")}
	}
	return a.backlog(ctx, topic, subscription, now)
}

func unknownBacklog(topic, subscription string, at time.Time, why string) protocol.BacklogStatus {
	return protocol.BacklogStatus{Topic: topic, Subscription: subscription, ReadAt: at, Unknown: why}
}

// retention is what may delete a subscription's backlog: the applied message TTL and quotas.
type retention struct {
	ttlSeconds *int64
	quotas     []protocol.BacklogQuota
}

func (a *Client) backlog(ctx context.Context, topic, subscription string, now time.Time) []protocol.BacklogStatus {
	full, err := fullTopicName(topic)
	if err != nil {
		return []protocol.BacklogStatus{unknownBacklog(topic, subscription, now, err.Error())}
	}
	topics, err := a.partitionNames(ctx, full)
	if err != nil {
		return []protocol.BacklogStatus{unknownBacklog(full, subscription, now, unknownReason("partition metadata", err))}
	}
	// The backlog itself needs only lookup rights; without the rights to read the retention
	// policies it is still reported, with the retention marked unknown.
	ret, err := a.retention(ctx, full)
	out := make([]protocol.BacklogStatus, 0, len(topics))
	for _, t := range topics {
		st := a.partitionBacklog(ctx, t, subscription, ret, now)
		if err != nil && st.Unknown == "" {
			st.RetentionUnknown = unknownReason("retention policies", err)
		}
		out = append(out, st)
	}
	return out
}

// partitionBacklog reads one topic's (partition's) stats for the subscription.
func (a *Client) partitionBacklog(ctx context.Context, topic, subscription string, ret retention, now time.Time) protocol.BacklogStatus {
	base, err := TopicPath(topic)
	if err != nil {
		return unknownBacklog(topic, subscription, now, err.Error())
	}
	var stats struct {
		Subscriptions map[string]subscriptionStats `json:"subscriptions"`
	}
	if _, err := a.call(ctx, http.MethodGet, base+"/stats?getEarliestTimeInBacklog=true", nil, &stats); err != nil {
		return unknownBacklog(topic, subscription, now, unknownReason("topic stats", err))
	}
	sub, ok := stats.Subscriptions[subscription]
	if !ok {
		return unknownBacklog(topic, subscription, now, fmt.Sprintf("subscription %q does not exist on the topic", subscription))
	}
	st := protocol.BacklogStatus{
		Topic: topic, Subscription: subscription, Messages: sub.MsgBacklog, Bytes: sub.BacklogSize, ReadAt: now,
		MessageTTLSeconds: ret.ttlSeconds, Quotas: ret.quotas,
	}
	if ms := sub.EarliestMsgPublishTimeInBacklog; ms > 0 && sub.MsgBacklog > 0 {
		t := time.UnixMilli(ms).UTC()
		st.OldestPublishTime = &t
	}
	st.KeySharedStall = keySharedStall(sub)
	return st
}

// subscriptionStats is the part of a subscription's topic stats the backlog report reads.
type subscriptionStats struct {
	MsgBacklog  int64 `json:"msgBacklog"`
	BacklogSize int64 `json:"backlogSize"`
	// The entry timestamp (the broker's when it stamps entries, else the publish time)
	// of the first unacknowledged entry: what message TTL compares; -1 when empty.
	EarliestMsgPublishTimeInBacklog int64  `json:"earliestMsgPublishTimeInBacklog"`
	Type                            string `json:"type"`
	// MsgInReplay is the dispatcher's replay queue in entries (redeliveryMessages.size()).
	MsgInReplay int64           `json:"msgInReplay"`
	Consumers   []consumerStats `json:"consumers"`
}

type consumerStats struct {
	ConsumerName        string `json:"consumerName"`
	AvailablePermits    int64  `json:"availablePermits"`
	UnackedMessages     int64  `json:"unackedMessages"`
	AvgMessagesPerEntry int64  `json:"avgMessagesPerEntry"`
}

// keySharedStall reports a Key_Shared subscription whose running consumers get nothing because
// halted ones hold dispatch back (PersistentStickyKeyDispatcherMultipleConsumers: a halted
// consumer's entries go to the replay queue, and once it holds getEffectiveLookAheadLimit()
// entries normal reads stop for every consumer). The stats show it as: a consumer without
// permits, every consumer with permits holding no unacked message, and entries in the backlog
// that are neither in the replay queue nor unacknowledged, i.e. that nobody was given. When the
// siblings merely drained their own keys (the backlog is the halted consumers' share) nothing
// waits and no stall is reported. Units: msgBacklog and msgInReplay count entries, unacked
// counts messages (avgMessagesPerEntry converts).
func keySharedStall(sub subscriptionStats) *protocol.KeySharedStall {
	if sub.Type != "Key_Shared" || sub.MsgInReplay <= 0 || sub.MsgBacklog <= sub.MsgInReplay {
		return nil
	}
	s := &protocol.KeySharedStall{InReplay: sub.MsgInReplay, Waiting: sub.MsgBacklog - sub.MsgInReplay}
	for _, c := range sub.Consumers {
		s.Waiting -= ceilDiv(c.UnackedMessages, max(c.AvgMessagesPerEntry, 1))
		switch {
		case c.AvailablePermits <= 0:
			s.Halted, s.HaltedCount = appendBounded(s.Halted, c.ConsumerName), s.HaltedCount+1
		case c.UnackedMessages > 0:
			return nil // a running consumer is being served
		default:
			s.Starved, s.StarvedCount = appendBounded(s.Starved, c.ConsumerName), s.StarvedCount+1
		}
	}
	if s.HaltedCount == 0 || s.StarvedCount == 0 || s.Waiting <= 0 {
		return nil
	}
	return s
}

func ceilDiv(a, b int64) int64 { return (max(a, 0) + b - 1) / b }

func appendBounded(names []string, name string) []string {
	if len(names) >= protocol.MaxStallNames {
		return names
	}
	return append(names, name)
}

// partitionNames lists the partitions of a partitioned topic, or the topic itself.
func (a *Client) partitionNames(ctx context.Context, full string) ([]string, error) {
	base, err := TopicPath(full)
	if err != nil {
		return nil, err
	}
	var meta struct {
		Partitions int `json:"partitions"`
	}
	if _, err := a.call(ctx, http.MethodGet, base+"/partitions", nil, &meta); err != nil {
		return nil, err
	}
	if meta.Partitions <= 0 {
		return []string{full}, nil
	}
	names := make([]string, meta.Partitions)
	for i := range names {
		names[i] = full + "-partition-" + strconv.Itoa(i)
	}
	return names, nil
}

// retention reads the topic's applied message TTL and backlog quotas. The partitions of a
// partitioned topic share its policies, so they are read once, on the topic's own name.
func (a *Client) retention(ctx context.Context, full string) (retention, error) {
	base, err := TopicPath(full)
	if err != nil {
		return retention{}, err
	}
	var ret retention
	raw, err := a.callOptional(ctx, base+"/messageTTL?applied=true")
	if err != nil {
		return retention{}, err
	}
	if raw != "" && raw != "null" {
		ttl, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return retention{}, fmt.Errorf("agent: admin messageTTL answered %q", raw)
		}
		if ttl > 0 {
			ret.ttlSeconds = &ttl
		}
	}
	var quotas map[string]struct {
		Limit     *int64 `json:"limit"` // deprecated spelling of limitSize, from older brokers
		LimitSize *int64 `json:"limitSize"`
		LimitTime int64  `json:"limitTime"`
		Policy    string `json:"policy"`
	}
	if _, err := a.call(ctx, http.MethodGet, base+"/backlogQuotaMap?applied=true", nil, &quotas); err != nil {
		return retention{}, err
	}
	for kind, q := range quotas {
		size := q.LimitSize
		if size == nil {
			size = q.Limit
		}
		bq := protocol.BacklogQuota{Type: kind, LimitSeconds: max(q.LimitTime, 0), Policy: q.Policy}
		if size != nil {
			bq.LimitBytes = max(*size, 0)
		}
		if bq.LimitBytes > 0 || bq.LimitSeconds > 0 {
			ret.quotas = append(ret.quotas, bq)
		}
	}
	slices.SortFunc(ret.quotas, func(x, y protocol.BacklogQuota) int { return strings.Compare(x.Type, y.Type) })
	return ret, nil
}

// callOptional GETs an optional JSON scalar: "" when the broker answers 204 or nothing.
func (a *Client) callOptional(ctx context.Context, path string) (string, error) {
	resp, err := a.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", &adminError{Status: resp.StatusCode, Path: path, Reason: reasonOf(resp.Body)}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	return strings.TrimSpace(string(b)), err
}

// unknownReason explains a failed read in terms of what an operator can change.
func unknownReason(what string, err error) string {
	var ae *adminError
	if !errors.As(err, &ae) {
		var ue *url.Error
		if errors.As(err, &ue) {
			return fmt.Sprintf("admin API unreachable reading %s: %v", what, ue.Err)
		}
		return fmt.Sprintf("reading %s: %v", what, err)
	}
	switch ae.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		need := "lookup (produce or consume) permission on the topic"
		if what == "retention policies" {
			need = "tenant admin rights (message TTL and backlog quotas are topic policies)"
		}
		return fmt.Sprintf("the admin API refused the application's credentials reading %s (HTTP %d: %s); it needs %s", what, ae.Status, ae.Reason, need)
	case http.StatusNotFound:
		return fmt.Sprintf("not found reading %s (HTTP 404: %s)", what, ae.Reason)
	case http.StatusMethodNotAllowed:
		return fmt.Sprintf("the broker does not serve %s (HTTP 405: %s); topic-level policies may be disabled (topicLevelPoliciesEnabled)", what, ae.Reason)
	}
	return fmt.Sprintf("reading %s: HTTP %d: %s", what, ae.Status, ae.Reason)
}

// fullTopicName is persistent://tenant/namespace/topic for a short or full name.
func fullTopicName(topic string) (string, error) {
	path, err := TopicPath(topic)
	if err != nil {
		return "", err
	}
	rest, _ := strings.CutPrefix(path, "/admin/v2/persistent/")
	parts := strings.Split(rest, "/")
	for i, p := range parts {
		parts[i], _ = url.PathUnescape(p)
	}
	return "persistent://" + strings.Join(parts, "/"), nil
}
