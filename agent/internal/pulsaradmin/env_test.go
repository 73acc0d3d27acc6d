package pulsaradmin

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// The integration tests run against any broker, as the agent's conformance suite does: an
// in-process pulsartest broker, or the one named by PULSAR_URL (pulsar://host:6650) and
// PULSAR_ADMIN_URL (http://host:8080). What they check is read back through the admin REST API,
// as an operator would read it.

// poll is how the tests wait for a condition.
var poll = testkit.Poll{Within: 10 * time.Second, Every: time.Millisecond}

// testBroker is the test's broker with a client connected to it and a Client of its admin API.
type testBroker struct {
	local    *pulsartest.Broker // the in-process broker; nil against a remote broker
	adminURL string
	client   pulsar.Client
	api      *Client
}

// newTestBroker starts an in-process broker configured with opts, or uses the remote one; a test
// that configures the broker skips on a remote one.
func newTestBroker(t testing.TB, opts ...pulsartest.Options) *testBroker {
	t.Helper()
	serviceURL, adminURL := os.Getenv("PULSAR_URL"), os.Getenv("PULSAR_ADMIN_URL")
	e := &testBroker{}
	switch {
	case serviceURL != "" && adminURL != "":
		if len(opts) > 0 && !reflect.ValueOf(opts[0]).IsZero() {
			t.Skipf("needs a broker configured with %+v (in-process pulsartest only)", opts[0])
		}
		e.adminURL = strings.TrimRight(adminURL, "/")
	case serviceURL != "" || adminURL != "":
		t.Fatalf("set both PULSAR_URL and PULSAR_ADMIN_URL to run against a remote broker (got %q and %q)", serviceURL, adminURL)
	default:
		e.local = pulsartest.Start(t, opts...)
		serviceURL, e.adminURL = e.local.ServiceURL(), e.local.AdminURL()
	}
	e.client = testkit.NewClient(t, serviceURL)
	e.api = New(e.adminURL, nil, nil, nil)
	return e
}

// pulsartest returns the in-process broker, or skips the test on a remote broker.
func (e *testBroker) pulsartest(t testing.TB, why string) *pulsartest.Broker {
	t.Helper()
	if e.local == nil {
		t.Skipf("needs the in-process pulsartest broker: %s", why)
	}
	return e.local
}

// produce sends n messages to topic, one entry each.
func (e *testBroker) produce(t testing.TB, topic string, n int) {
	t.Helper()
	p := testkit.NewProducer(t, e.client, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	testkit.Produce(t, p, "m", n)
	p.Close()
}

// createPartitioned creates a partitioned topic through the admin API.
func (e *testBroker) createPartitioned(t testing.TB, topic string, partitions int) {
	t.Helper()
	path, err := TopicPath(topic)
	if err != nil {
		t.Fatal(err)
	}
	e.adminJSON(t, http.MethodPut, path+"/partitions", strconv.Itoa(partitions), nil)
}

// adminJSON calls the admin API and fails the test unless it answers 2xx (testkit.AdminOK).
func (e *testBroker) adminJSON(t testing.TB, method, path, body string, out any) {
	t.Helper()
	testkit.AdminOK(t, e.adminURL, method, path, body, out)
}

// admin calls the admin API and returns the status (testkit.Admin).
func (e *testBroker) admin(t testing.TB, method, path, body string, out any) int {
	t.Helper()
	return testkit.Admin(t, e.adminURL, method, path, body, out)
}

// uniqueTopic names a topic no other test, run or process uses, so that a shared remote broker
// needs no cleanup between tests.
func uniqueTopic(t testing.TB) string {
	name := []byte(t.Name())
	for i, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			name[i] = '-'
		}
	}
	return fmt.Sprintf("persistent://public/default/%s-%d-%s", name, time.Now().UnixNano(), rand.Text()[:6])
}
