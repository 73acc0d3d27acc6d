package pulsartest

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// policyRoutes serves messageTTL and backlog quotas with Pulsar's paths and
// shapes: namespace level (Namespaces; any broker answers) and topic level
// (PersistentTopics; the owner answers, others redirect).
func (b *Broker) policyRoutes(mux *http.ServeMux, owned func(string, http.HandlerFunc)) {
	const ns = "/admin/v2/namespaces/{tenant}/{namespace}"
	mux.HandleFunc("GET "+ns+"/messageTTL", b.getNamespaceTTL)
	mux.HandleFunc("POST "+ns+"/messageTTL", b.setNamespaceTTL)
	mux.HandleFunc("DELETE "+ns+"/messageTTL", b.removeNamespaceTTL)
	mux.HandleFunc("POST "+ns+"/backlogQuota", b.setNamespaceQuota)
	mux.HandleFunc("DELETE "+ns+"/backlogQuota", b.removeNamespaceQuota)
	mux.HandleFunc("GET "+ns+"/backlogQuotaMap", b.getNamespaceQuotaMap)

	const topic = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
	owned("GET "+topic+"/messageTTL", b.withPolicyTopic(b.getTopicTTL))
	owned("POST "+topic+"/messageTTL", b.withPolicyTopic(b.setTopicTTL))
	owned("DELETE "+topic+"/messageTTL", b.withPolicyTopic(b.removeTopicTTL))
	owned("POST "+topic+"/backlogQuota", b.withPolicyTopic(b.setTopicQuota))
	owned("DELETE "+topic+"/backlogQuota", b.withPolicyTopic(b.removeTopicQuota))
	owned("GET "+topic+"/backlogQuotaMap", b.withPolicyTopic(b.getTopicQuotaMap))
}

// backlogQuotaJSON is BacklogQuotaImpl as Jackson writes it: the deprecated
// "limit" repeats limitSize.
type backlogQuotaJSON struct {
	Limit     int64  `json:"limit"`
	LimitSize int64  `json:"limitSize"`
	LimitTime int    `json:"limitTime"`
	Policy    string `json:"policy"`
}

func quotaJSON(q BacklogQuota) backlogQuotaJSON {
	return backlogQuotaJSON{Limit: q.LimitSize, LimitSize: q.LimitSize, LimitTime: q.LimitTime, Policy: q.Policy}
}

func quotaMapJSON(m map[string]BacklogQuota) map[string]backlogQuotaJSON {
	out := map[string]backlogQuotaJSON{}
	for kind, q := range m {
		out[kind] = quotaJSON(q)
	}
	return out
}

func namespaceKey(r *http.Request) string {
	return r.PathValue("tenant") + "/" + r.PathValue("namespace")
}

// readTTL reads a TTL in seconds from the query parameter messageTTL (the
// topic endpoint) or else from the body (the namespace endpoint). A
// negative TTL answers 412 as internalSetMessageTTL does.
func readTTL(w http.ResponseWriter, r *http.Request) (int, bool) {
	raw := r.URL.Query().Get("messageTTL")
	if raw == "" {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<10))
		raw = strings.TrimSpace(string(body))
	}
	ttl, err := strconv.Atoi(raw)
	if err != nil {
		writeReason(w, http.StatusBadRequest, "message TTL must be an integer number of seconds")
		return 0, false
	}
	if ttl < 0 {
		writeReason(w, http.StatusPreconditionFailed, "Invalid value for message TTL")
		return 0, false
	}
	return ttl, true
}

// readQuota reads backlogQuotaType (default destination_storage, as
// internalSetBacklogQuota) and a BacklogQuota body; the deprecated "limit"
// stands for limitSize when that is absent.
func readQuota(w http.ResponseWriter, r *http.Request) (string, BacklogQuota, bool) {
	kind, ok := readQuotaType(w, r)
	if !ok {
		return "", BacklogQuota{}, false
	}
	var in struct {
		Limit     *int64 `json:"limit"`
		LimitSize *int64 `json:"limitSize"`
		LimitTime int    `json:"limitTime"`
		Policy    string `json:"policy"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&in); err != nil {
		writeReason(w, http.StatusBadRequest, "invalid backlog quota: "+err.Error())
		return "", BacklogQuota{}, false
	}
	if !validQuotaPolicy(in.Policy) {
		writeReason(w, http.StatusBadRequest, "policy must be consumer_backlog_eviction, producer_request_hold or producer_exception")
		return "", BacklogQuota{}, false
	}
	q := BacklogQuota{LimitTime: in.LimitTime, Policy: in.Policy}
	switch {
	case in.LimitSize != nil:
		q.LimitSize = *in.LimitSize
	case in.Limit != nil:
		q.LimitSize = *in.Limit
	}
	return kind, q, true
}

func readQuotaType(w http.ResponseWriter, r *http.Request) (string, bool) {
	kind := r.URL.Query().Get("backlogQuotaType")
	if kind == "" {
		kind = QuotaDestinationStorage
	}
	if !validQuotaType(kind) {
		writeReason(w, http.StatusBadRequest, "backlogQuotaType must be destination_storage or message_age")
		return "", false
	}
	return kind, true
}

// writeOptionalInt answers an Integer policy; unset is a null entity.
func writeOptionalInt(w http.ResponseWriter, v int, ok bool) {
	if !ok {
		// A null Integer: 200 with an empty body (Content-Length 0), as
		// the 4.0 and 4.2 brokers answer it.
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (b *Broker) updatePolicies(f func(p *policies)) {
	b.st.mu.Lock()
	f(&b.st.policies)
	b.st.mu.Unlock()
}

func (b *Broker) getNamespaceTTL(w http.ResponseWriter, r *http.Request) {
	b.st.mu.Lock()
	v, ok := b.st.policies.namespaceTTL[namespaceKey(r)]
	b.st.mu.Unlock()
	writeOptionalInt(w, v, ok)
}

func (b *Broker) setNamespaceTTL(w http.ResponseWriter, r *http.Request) {
	ttl, ok := readTTL(w, r)
	if !ok {
		return
	}
	b.updatePolicies(func(p *policies) { p.namespaceTTL[namespaceKey(r)] = ttl })
	w.WriteHeader(http.StatusNoContent)
}

func (b *Broker) removeNamespaceTTL(w http.ResponseWriter, r *http.Request) {
	b.updatePolicies(func(p *policies) { delete(p.namespaceTTL, namespaceKey(r)) })
	w.WriteHeader(http.StatusNoContent)
}

func (b *Broker) setNamespaceQuota(w http.ResponseWriter, r *http.Request) {
	kind, q, ok := readQuota(w, r)
	if !ok {
		return
	}
	b.updatePolicies(func(p *policies) { setQuota(p.namespaceQuota, namespaceKey(r), kind, q) })
	w.WriteHeader(http.StatusNoContent)
}

func (b *Broker) removeNamespaceQuota(w http.ResponseWriter, r *http.Request) {
	kind, ok := readQuotaType(w, r)
	if !ok {
		return
	}
	b.updatePolicies(func(p *policies) { delete(p.namespaceQuota[namespaceKey(r)], kind) })
	w.WriteHeader(http.StatusNoContent)
}

func (b *Broker) getNamespaceQuotaMap(w http.ResponseWriter, r *http.Request) {
	b.st.mu.Lock()
	out := quotaMapJSON(b.st.policies.namespaceQuota[namespaceKey(r)])
	b.st.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func setQuota(m map[string]map[string]BacklogQuota, key, kind string, q BacklogQuota) {
	if m[key] == nil {
		m[key] = map[string]BacklogQuota{}
	}
	m[key][kind] = q
}

// withPolicyTopic resolves an existing topic (or partitioned topic) for a
// topic-level policy, 404 otherwise; policies are kept by its base name.
func (b *Broker) withPolicyTopic(h func(http.ResponseWriter, *http.Request, topicName)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tn, err := parseTopic(fullFromPath(r))
		if err != nil {
			writeReason(w, http.StatusBadRequest, err.Error())
			return
		}
		if b.partitionsOf(tn.base()) == 0 && b.getTopic(tn.full, false) == nil {
			writeReason(w, http.StatusNotFound, "Topic not found")
			return
		}
		h(w, r, tn)
	}
}

func applied(r *http.Request) bool { return r.URL.Query().Get("applied") == "true" }

func (b *Broker) getTopicTTL(w http.ResponseWriter, r *http.Request, tn topicName) {
	if applied(r) {
		writeJSON(w, http.StatusOK, b.appliedTTL(tn))
		return
	}
	b.st.mu.Lock()
	v, ok := b.st.policies.topicTTL[tn.base()]
	b.st.mu.Unlock()
	writeOptionalInt(w, v, ok)
}

func (b *Broker) setTopicTTL(w http.ResponseWriter, r *http.Request, tn topicName) {
	ttl, ok := readTTL(w, r)
	if !ok {
		return
	}
	b.updatePolicies(func(p *policies) { p.topicTTL[tn.base()] = ttl })
	w.WriteHeader(http.StatusNoContent)
}

func (b *Broker) removeTopicTTL(w http.ResponseWriter, _ *http.Request, tn topicName) {
	b.updatePolicies(func(p *policies) { delete(p.topicTTL, tn.base()) })
	w.WriteHeader(http.StatusNoContent)
}

func (b *Broker) setTopicQuota(w http.ResponseWriter, r *http.Request, tn topicName) {
	kind, q, ok := readQuota(w, r)
	if !ok {
		return
	}
	b.updatePolicies(func(p *policies) { setQuota(p.topicQuota, tn.base(), kind, q) })
	w.WriteHeader(http.StatusNoContent)
}

func (b *Broker) removeTopicQuota(w http.ResponseWriter, r *http.Request, tn topicName) {
	kind, ok := readQuotaType(w, r)
	if !ok {
		return
	}
	b.updatePolicies(func(p *policies) { delete(p.topicQuota[tn.base()], kind) })
	w.WriteHeader(http.StatusNoContent)
}

// getTopicQuotaMap answers the topic's own quotas, or with applied=true the
// effective quota of each type (topic, else namespace, else broker default).
func (b *Broker) getTopicQuotaMap(w http.ResponseWriter, r *http.Request, tn topicName) {
	if applied(r) {
		writeJSON(w, http.StatusOK, map[string]backlogQuotaJSON{
			QuotaDestinationStorage: quotaJSON(b.appliedQuota(tn, QuotaDestinationStorage)),
			QuotaMessageAge:         quotaJSON(b.appliedQuota(tn, QuotaMessageAge)),
		})
		return
	}
	b.st.mu.Lock()
	out := quotaMapJSON(b.st.policies.topicQuota[tn.base()])
	b.st.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}
