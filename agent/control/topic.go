package control

import (
	"regexp"
	"strings"

	"github.com/apache/pulsar-client-go/pulsar"
)

// fullTopic normalises a topic name as Pulsar does: "t" and "tenant/ns/t" gain their defaults,
// and a partition suffix is cut so that a rule for a partitioned topic covers its partitions.
func fullTopic(name string) string {
	if !strings.Contains(name, "://") {
		switch strings.Count(name, "/") {
		case 0:
			name = "persistent://public/default/" + name
		default:
			name = "persistent://" + name
		}
	}
	if i := strings.LastIndex(name, "-partition-"); i > 0 && isDigits(name[i+len("-partition-"):]) {
		name = name[:i]
	}
	return name
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// consumesTopic reports whether a consumer created with opts reads topic (any form of the name).
// Regex consumers match by their pattern, so a topic they discover later is covered as well.
func consumesTopic(opts pulsar.ConsumerOptions, topic string) bool {
	want := fullTopic(topic)
	if opts.Topic != "" && fullTopic(opts.Topic) == want {
		return true
	}
	for _, t := range opts.Topics {
		if fullTopic(t) == want {
			return true
		}
	}
	if opts.TopicsPattern != "" {
		re, err := regexp.Compile(opts.TopicsPattern)
		return err == nil && (re.MatchString(want) || re.MatchString(strings.TrimPrefix(want, "persistent://")))
	}
	return false
}
