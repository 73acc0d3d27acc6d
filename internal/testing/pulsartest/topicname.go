package pulsartest

import (
	"fmt"
	"strconv"
	"strings"
)

const partitionSuffix = "-partition-"

// topicName is a topic name in its full form, split into its parts.
type topicName struct {
	full      string // persistent://tenant/ns/local
	tenant    string
	namespace string
	local     string // includes -partition-N for a partition
	partition int    // -1 when not a partition
}

// parseTopic accepts the short forms the client accepts ("t", "tenant/ns/t")
// and the full form, and returns the full name, so that both spell one topic.
func parseTopic(name string) (topicName, error) {
	rest := name
	if i := strings.Index(rest, "://"); i >= 0 {
		if rest[:i] != "persistent" {
			return topicName{}, fmt.Errorf("unsupported topic domain in %q", name)
		}
		rest = rest[i+3:]
	}
	var parts []string
	switch n := strings.Count(rest, "/"); {
	case n == 0:
		parts = []string{"public", "default", rest}
	case n >= 2:
		parts = strings.SplitN(rest, "/", 3)
	default:
		return topicName{}, fmt.Errorf("invalid topic name %q", name)
	}
	if parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return topicName{}, fmt.Errorf("invalid topic name %q", name)
	}
	tn := topicName{tenant: parts[0], namespace: parts[1], local: parts[2], partition: -1}
	tn.full = "persistent://" + tn.tenant + "/" + tn.namespace + "/" + tn.local
	if i := strings.LastIndex(tn.local, partitionSuffix); i > 0 {
		if p, err := strconv.Atoi(tn.local[i+len(partitionSuffix):]); err == nil && p >= 0 {
			tn.partition = p
		}
	}
	return tn, nil
}

// base is the partitioned topic a partition belongs to, or the name itself.
func (tn topicName) base() string {
	if tn.partition < 0 {
		return tn.full
	}
	return tn.full[:strings.LastIndex(tn.full, partitionSuffix)]
}

func partitionName(base string, i int) string {
	return base + partitionSuffix + strconv.Itoa(i)
}

// mustFull normalises a name given by a test; invalid names stay as they are
// so that lookups simply find nothing.
func mustFull(name string) string {
	tn, err := parseTopic(name)
	if err != nil {
		return name
	}
	return tn.full
}
