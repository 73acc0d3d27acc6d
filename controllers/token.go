package controllers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// DefaultTokenSecret is the Secret holding the agents' bearer token when a flow names none.
const (
	DefaultTokenSecret = "subflow-agent-token"
	DefaultTokenKey    = "token"
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

// agentToken reads the flow's token Secret (uncached: the manager's client reads Secrets
// directly) and creates it with a random token when missing. Only the namespace's agent-token
// Secret is used: the default name, or a Secret labelled subflow.dev/agent-token=true.
func (r *SubscriptionFlowReconciler) agentToken(ctx context.Context, flow *subflowv1.SubscriptionFlow) (string, error) {
	name, key := tokenRef(flow)
	var secret corev1.Secret
	err := r.Get(ctx, types.NamespacedName{Namespace: flow.Namespace, Name: name}, &secret)
	switch {
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
