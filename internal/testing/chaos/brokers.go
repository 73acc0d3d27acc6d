package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// brokerSide is the Pulsar a run drives: the in-process two-broker test cluster
// (internal/testing/pulsartest), or a real broker named by Config.ServiceURL and Config.AdminURL.
// Topic arguments are the run's short names (producedTopics); root makes them full.
type brokerSide interface {
	describe() string
	// root is "persistent://tenant/namespace/", the prefix of the run's topics.
	root() string
	// serviceURL is the producers' (they go direct) and the wire recorder's upstream.
	serviceURL() string
	// adminURLs are the brokers' admin APIs, the leader's first: one agent admin proxy
	// listener each.
	adminURLs() []string
	createPartitioned(topic string, partitions int) error
	// dropConnections cuts client connections (k picks a broker where there are several)
	// and says which.
	dropConnections(wire *wirerec.Proxy, k int) string
	// unload unloads a topic; a partitioned base name unloads every partition.
	unload(topic string) error
	// draws reports whether operations of the kind can be applied to this broker side.
	draws(kind string) bool
	// moveTopic and setLatency are the test cluster's only (draws says no elsewhere).
	moveTopic(topic string, to int) error
	setLatency(d time.Duration)
	close() error
}

func newBrokerSide(cfg Config) (brokerSide, error) {
	if cfg.ServiceURL == "" && cfg.AdminURL == "" {
		c, err := pulsartest.NewCluster(clusterBrokers, pulsartest.Options{})
		if err != nil {
			return nil, err
		}
		return &testCluster{c: c}, nil
	}
	if cfg.ServiceURL == "" || cfg.AdminURL == "" {
		return nil, fmt.Errorf("a real broker needs both its service URL (%q) and its admin URL (%q)", cfg.ServiceURL, cfg.AdminURL)
	}
	b, err := newRealBroker(cfg.ServiceURL, cfg.AdminURL)
	if err != nil {
		return nil, err // not a nil *realBroker in a non-nil interface
	}
	return b, nil
}

// testCluster is the in-process cluster: topics move between its brokers, clients follow
// lookups and admin calls follow 307 redirects to the owner.
type testCluster struct{ c *pulsartest.Cluster }

func (t *testCluster) describe() string {
	return fmt.Sprintf("in-process test cluster (internal/testing/pulsartest, %d brokers)", clusterBrokers)
}
func (t *testCluster) root() string       { return "persistent://public/default/" }
func (t *testCluster) serviceURL() string { return t.c.Broker(0).ServiceURL() }

func (t *testCluster) adminURLs() []string {
	var urls []string
	for _, b := range t.c.Brokers() {
		urls = append(urls, b.AdminURL())
	}
	return urls
}

func (t *testCluster) createPartitioned(topic string, partitions int) error {
	return t.c.Broker(0).CreatePartitionedTopic(t.root()+topic, partitions)
}

func (t *testCluster) dropConnections(_ *wirerec.Proxy, k int) string {
	k %= len(t.c.Brokers())
	t.c.Broker(k).DropConnections()
	return fmt.Sprintf("every connection to broker %d", k)
}

func (t *testCluster) unload(topic string) error { return t.c.Broker(0).UnloadTopic(t.root() + topic) }
func (t *testCluster) draws(string) bool         { return true }
func (t *testCluster) moveTopic(topic string, to int) error {
	return t.c.MoveTopic(t.root()+topic, to)
}

func (t *testCluster) setLatency(d time.Duration) {
	for _, b := range t.c.Brokers() {
		b.SetLatency(d)
	}
}

func (t *testCluster) close() error { return t.c.Close() }

// realBroker is an Apache Pulsar broker the run does not own. It keeps what earlier runs
// left, so each run has a namespace of its own, created at the start (and left behind: the
// broker's owner decides when data goes). One cannot make it drop connections or add latency:
// a drop cuts every connection at the wire recorder (the agents' clients; the producers go
// direct and keep theirs), topics do not move and latency is not drawn.
type realBroker struct {
	service, admin string
	namespace      string // public/<run-unique name>
	version        string
	http           *http.Client
}

// realAdminTimeout bounds one admin call of the harness (an unload waits for the topic to close).
const realAdminTimeout = 30 * time.Second

func newRealBroker(service, admin string) (*realBroker, error) {
	b := &realBroker{service: service, admin: strings.TrimRight(admin, "/"), http: &http.Client{Timeout: realAdminTimeout}}
	if v, err := b.call(http.MethodGet, "/admin/v2/brokers/version", ""); err == nil {
		b.version = strings.TrimSpace(v)
	}
	name := fmt.Sprintf("chaos-%s-%04x", time.Now().UTC().Format("20060102-150405"), rand.IntN(1<<16))
	if _, err := b.call(http.MethodPut, "/admin/v2/namespaces/public/"+name, ""); err != nil {
		return nil, fmt.Errorf("creating the run's namespace: %w", err)
	}
	b.namespace = "public/" + name
	return b, nil
}

// call makes an admin call and returns the body of a 2xx answer.
func (b *realBroker) call(method, path, body string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), realAdminTimeout)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.admin+path, rd)
	if err != nil {
		return "", err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(data)))
	}
	return string(data), nil
}

func (b *realBroker) describe() string {
	v := b.version
	if v == "" {
		v = "(version unknown)"
	}
	return fmt.Sprintf("Apache Pulsar %s at %s (admin %s), namespace %s", v, b.service, b.admin, b.namespace)
}

func (b *realBroker) root() string        { return "persistent://" + b.namespace + "/" }
func (b *realBroker) serviceURL() string  { return b.service }
func (b *realBroker) adminURLs() []string { return []string{b.admin} }
func (b *realBroker) topicPath(topic string) string {
	return "/admin/v2/persistent/" + b.namespace + "/" + topic
}

func (b *realBroker) createPartitioned(topic string, partitions int) error {
	_, err := b.call(http.MethodPut, b.topicPath(topic)+"/partitions", fmt.Sprint(partitions))
	return err
}

func (b *realBroker) dropConnections(wire *wirerec.Proxy, _ int) string {
	wire.DropConnections()
	return "every connection at the wire recorder (the agents' clients)"
}

func (b *realBroker) unload(topic string) error {
	_, err := b.call(http.MethodPut, b.topicPath(topic)+"/unload", "")
	return err
}

func (b *realBroker) draws(kind string) bool { return kind != opTopicMove && kind != opBrokerLatency }

func (b *realBroker) moveTopic(string, int) error {
	return fmt.Errorf("a real broker's topics are not moved by the run")
}

func (b *realBroker) setLatency(time.Duration) {}
func (b *realBroker) close() error             { return nil }
