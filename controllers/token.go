package controllers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// DefaultTokenSecret and DefaultTokenKey hold the agents' bearer token when a flow names none
// (declared with the API: the webhook mounts them too).
const (
	DefaultTokenSecret = subflowv1.DefaultTokenSecret
	DefaultTokenKey    = subflowv1.DefaultTokenKey
)

func tokenRef(flow *subflowv1.SubscriptionFlow) (name, key string) {
	name, key = DefaultTokenSecret, DefaultTokenKey
	if ref := flow.Spec.Agent.TokenSecretRef; ref != nil {
		name = ref.Name
		if ref.Key != "" {
			key = ref.Key
		}
	}
	return name, key
}

// TokenSecretLabel marks a Secret other than DefaultTokenSecret as an agent-token Secret the
// controller may read. Any other Secret is refused: a flow's author must not be able to make the
// controller read a Secret of their choosing and send it to pods of their choosing.
const TokenSecretLabel = "subflow.dev/agent-token"

// tokenProblem is a token Secret that a person must fix; the flow stalls, nothing is pushed.
type tokenProblem struct{ msg string }

func (p *tokenProblem) Error() string { return p.msg }

// DefaultTokenRotationGrace is how long after a rotation the token a Secret held before is still
// offered to agents that refuse the new one. The kubelet rewrites a mounted Secret within its
// sync period plus its cache's lifetime - a minute or two, later on a busy node - and until then
// the pod's agent knows only the previous token.
const DefaultTokenRotationGrace = 10 * time.Minute

// agentTokens are the credentials for one flow's agents.
type agentTokens struct {
	Current string
	// Previous is what the Secret held before its last change, set while the rotation's grace
	// lasts; Until is when it ends.
	Previous string
	Until    time.Time
	// RotatedAt is when the controller saw the Secret change last; zero if it never did.
	RotatedAt time.Time
}

// rotating reports whether a previous token is still offered.
func (t agentTokens) rotating() bool { return t.Previous != "" }

// tokenBook remembers each token Secret's value as last read, so that a change is noticed and
// the value before it kept for the grace period. It is memory only: a controller that restarts
// during a rotation knows only the new token, and pods not yet updated stall until the kubelet
// updates them.
type tokenBook struct {
	mu   sync.Mutex
	seen map[string]tokenHistory
	// reading holds each Secret's read in flight, which overlapping reads wait for.
	reading map[string]*tokenRead
}

type tokenRead struct {
	done  chan struct{}
	token string
	err   error
}

// readShared returns read's result, calling it only when no read of the Secret is in flight;
// otherwise it waits for that one's. (The caller of the shared read owns its context: a
// cancelled one fails the others' read too, and they retry as after any error.)
func (b *tokenBook) readShared(secret string, read func() (string, error)) (string, error) {
	b.mu.Lock()
	if r, ok := b.reading[secret]; ok {
		b.mu.Unlock()
		<-r.done
		return r.token, r.err
	}
	if b.reading == nil {
		b.reading = map[string]*tokenRead{}
	}
	r := &tokenRead{done: make(chan struct{})}
	b.reading[secret] = r
	b.mu.Unlock()
	r.token, r.err = read()
	b.mu.Lock()
	delete(b.reading, secret)
	b.mu.Unlock()
	close(r.done)
	return r.token, r.err
}

type tokenHistory struct {
	current, previous string
	rotatedAt         time.Time
}

// observe records token as the Secret's value at now and returns what to offer agents.
func (b *tokenBook) observe(secret, token string, now time.Time, grace time.Duration) agentTokens {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen == nil {
		b.seen = map[string]tokenHistory{}
	}
	h, known := b.seen[secret]
	if known && h.current != token {
		h = tokenHistory{current: token, previous: h.current, rotatedAt: now}
	} else if !known {
		h = tokenHistory{current: token}
	}
	if h.previous != "" && !now.Before(h.rotatedAt.Add(grace)) {
		h.previous = ""
	}
	b.seen[secret] = h
	tokens := agentTokens{Current: token, RotatedAt: h.rotatedAt}
	if h.previous != "" {
		tokens.Previous, tokens.Until = h.previous, h.rotatedAt.Add(grace)
	}
	return tokens
}

func (r *SubscriptionFlowReconciler) tokenRotationGrace() time.Duration {
	if r.TokenRotationGrace > 0 {
		return r.TokenRotationGrace
	}
	return DefaultTokenRotationGrace
}

// agentToken reads the flow's token Secret and returns the tokens to offer its agents. Reads
// of one Secret that overlap share one API call: a fleet pause reconciles every flow of a
// namespace at once, and each uncached read is a round trip (a quorum read) that the API
// server serves among the status writes. A read that starts after another ended reads again,
// so a rotation is seen as soon as before.
func (r *SubscriptionFlowReconciler) agentToken(ctx context.Context, flow *subflowv1.SubscriptionFlow) (agentTokens, error) {
	ref := tokenRefText(flow)
	token, err := r.tokens.readShared(ref, func() (string, error) { return r.readToken(ctx, flow) })
	if err != nil {
		return agentTokens{}, err
	}
	return r.tokens.observe(ref, token, r.Clock.Now(), r.tokenRotationGrace()), nil
}

// readToken reads the flow's token Secret (uncached: the manager's client reads Secrets
// directly) and creates it with a random token when missing. Only the namespace's agent-token
// Secret is used: the default name, or a Secret labelled subflow.dev/agent-token=true.
func (r *SubscriptionFlowReconciler) readToken(ctx context.Context, flow *subflowv1.SubscriptionFlow) (string, error) {
	name, key := tokenRef(flow)
	var secret corev1.Secret
	err := r.Get(ctx, types.NamespacedName{Namespace: flow.Namespace, Name: name}, &secret)
	switch {
	case apierrors.IsNotFound(err) && name != DefaultTokenSecret:
		// The controller may create only the default Secret (RBAC and the chart's admission
		// policy): say what to do rather than retry a create that is refused.
		return "", &tokenProblem{fmt.Sprintf("Secret %s/%s does not exist: the controller creates only %s; create it with a "+
			"random token under key %q and label it %s=true", flow.Namespace, name, DefaultTokenSecret, key, TokenSecretLabel)}
	case apierrors.IsNotFound(err):
		return r.createToken(ctx, flow.Namespace, name, key)
	case apierrors.IsForbidden(err):
		return "", &tokenProblem{fmt.Sprintf("the controller may not read Secret %s/%s: it reads %s by name; for another "+
			"name, label the Secret %s=true and grant the controller get on it", flow.Namespace, name, DefaultTokenSecret, TokenSecretLabel)}
	case err != nil:
		return "", err
	case name != DefaultTokenSecret && secret.Labels[TokenSecretLabel] != "true":
		return "", &tokenProblem{fmt.Sprintf("Secret %s/%s is not an agent-token Secret: label it %s=true to use it as "+
			"spec.agent.tokenSecretRef", flow.Namespace, name, TokenSecretLabel)}
	}
	token, ok := secret.Data[key]
	if !ok || len(token) == 0 {
		return "", &tokenProblem{fmt.Sprintf("Secret %s/%s has no key %q", flow.Namespace, name, key)}
	}
	return string(token), nil
}

func (r *SubscriptionFlowReconciler) createToken(ctx context.Context, namespace, name, key string) (string, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	token := hex.EncodeToString(raw)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "subflow", TokenSecretLabel: "true"}},
		Data: map[string][]byte{key: []byte(token)},
	}
	if err := r.Create(ctx, secret); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Another reconcile created it first: use theirs.
			return "", fmt.Errorf("token secret %s/%s appeared concurrently, retrying: %w", namespace, name, err)
		}
		return "", err
	}
	return token, nil
}

// withTokens calls call with the current token and, when the agent refuses it while a rotation's
// grace lasts, once more with the previous one; previous reports that the agent accepted only that one.
func withTokens[T any](t AgentTarget, call func(AgentTarget) (T, error)) (result T, previous bool, err error) {
	result, err = call(t)
	if !IsUnauthorized(err) || t.PreviousToken == "" {
		return result, false, err
	}
	t.Token = t.PreviousToken
	if result, retryErr := call(t); !IsUnauthorized(retryErr) {
		return result, true, retryErr
	}
	return result, false, err
}
