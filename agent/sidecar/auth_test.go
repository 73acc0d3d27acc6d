package sidecar

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// signedToken is a Pulsar token (an HS256 JWT) for subject, signed with key.
func signedToken(key []byte, subject string) string {
	enc := base64.RawURLEncoding
	unsigned := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." +
		enc.EncodeToString([]byte(`{"sub":"`+subject+`"}`))
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(unsigned))
	return unsigned + "." + enc.EncodeToString(mac.Sum(nil))
}

func tokenClient(t *testing.T, url, token string) pulsar.Client {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, Authentication: pulsar.NewAuthenticationToken(token),
		OperationTimeout: 10 * time.Second, ConnectionTimeout: 5 * time.Second, Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// On a broker with token authentication, the application's own token passes through the
// sidecar, which holds no credentials: a client with a token the broker signed produces and
// consumes, one with a token signed by another key is refused by the broker.
//
// It needs a broker started with token authentication and the key in PULSAR_TOKEN_SECRET
// (base64), e.g.:
//
//	key=$(head -c 32 /dev/urandom | base64 -w0)
//	PULSAR_TOKEN_SECRET=$key hack/pulsar/pulsar.sh exec --set authenticationEnabled=true \
//	  --set authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken \
//	  --set "tokenSecretKey=data:;base64,$key" --set anonymousUserRole=anonymous \
//	  -- go test -run TestTokenAuth ./agent/sidecar/
func TestTokenAuthPassesThrough(t *testing.T) {
	secret := os.Getenv("PULSAR_TOKEN_SECRET")
	if secret == "" || os.Getenv("PULSAR_URL") == "" {
		t.Skip("needs a real Pulsar with token authentication and its key in PULSAR_TOKEN_SECRET (see the comment)")
	}
	key, err := base64.StdEncoding.DecodeString(secret)
	if err != nil {
		t.Fatalf("PULSAR_TOKEN_SECRET: %v", err)
	}
	w := newWorld(t)
	topic := uniqueTopic(t)
	client := tokenClient(t, w.url, signedToken(key, "sidecar-app"))
	cons := subscribe(t, client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Name: "c1"})
	sent := produce(t, client, topic, "m", 0, 10)
	if m := missing(sent, receiveN(t, cons, len(sent))); len(m) > 0 {
		t.Fatalf("missing %v", m)
	}

	other := make([]byte, 32)
	_, _ = rand.Read(other)
	forged := tokenClient(t, w.url, signedToken(other, "sidecar-app"))
	p, err := forged.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = p.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("forged")})
		p.Close()
	}
	if err == nil {
		t.Fatal("a token signed with another key was accepted through the sidecar")
	}
	refused := false
	for _, e := range w.rec.Events(wirerec.Filter{}, pb.BaseCommand_ERROR) {
		refused = refused || strings.Contains(e.Error, "AuthenticationError")
	}
	if !refused {
		t.Errorf("the client failed (%v), but the broker's AuthenticationError is not on the wire", err)
	}
}
