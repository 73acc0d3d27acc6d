package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// The orders database, as the demo's flow depends on it: a Deployment whose Available
// condition the demo writes as the Deployment controller would.
const dependencyName = "orders-db"

// dependencyFails gives the flow a condition on the database's Deployment and takes the
// database down: the flow pauses itself, and nothing more reaches the applications.
func (d *demo) dependencyFails(ctx context.Context) error {
	labels := map[string]string{"app": dependencyName}
	db := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: dependencyName},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "postgres", Image: "postgres"}}}}}}
	if err := d.w.k8s.Create(ctx, db); err != nil {
		return err
	}
	if err := d.setAvailable(ctx, corev1.ConditionTrue); err != nil {
		return err
	}
	err := d.patch(ctx, `{"spec":{"pauseWhen":[{"name":"orders-db-down","resumeAfter":"30s","kubernetes":`+
		`{"apiVersion":"apps/v1","kind":"Deployment","name":"orders-db","conditionType":"Available","status":"False"}}]}}`)
	if err != nil {
		return err
	}
	if err := d.waitFor(ctx, "the condition read healthy", func(f *subflowv1.SubscriptionFlow) bool {
		return ready(f) && len(f.Status.PauseWhen) == 1 && f.Status.PauseWhen[0].Seen == "Available=True"
	}); err != nil {
		return err
	}
	fmt.Println("   the orders database goes down (its Deployment: Available=False)")
	if err := d.setAvailable(ctx, corev1.ConditionFalse); err != nil {
		return err
	}
	if err := d.tick(ctx, 11*time.Second); err != nil {
		return err
	}
	var f *subflowv1.SubscriptionFlow
	if err := d.waitFor(ctx, "Paused by the condition", func(got *subflowv1.SubscriptionFlow) bool {
		f = got
		return ready(got) && got.Status.StateSource == subflowv1.SourceCondition && meta.IsStatusConditionTrue(got.Status.Conditions, subflowv1.ConditionPaused)
	}); err != nil {
		return err
	}
	fmt.Printf("   AutoPaused: %s\n", meta.FindStatusCondition(f.Status.Conditions, subflowv1.ConditionAutoPaused).Message)
	delivered := d.w.delivered()
	return d.watch(ctx, 2*time.Second, func() error {
		if got := d.w.delivered(); got != delivered {
			return fmt.Errorf("%d messages reached the applications while their database was down", got-delivered)
		}
		return nil
	})
}

// dependencyRecovers brings the database back: the flow resumes once it has been healthy for
// resumeAfter, not at the first healthy reading.
func (d *demo) dependencyRecovers(ctx context.Context) error {
	fmt.Println("   the orders database is back (Available=True)")
	if err := d.setAvailable(ctx, corev1.ConditionTrue); err != nil {
		return err
	}
	if err := d.tick(ctx, 11*time.Second); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "the first healthy reading", func(f *subflowv1.SubscriptionFlow) bool {
		c := meta.FindStatusCondition(f.Status.Conditions, subflowv1.ConditionAutoPaused)
		return c != nil && strings.Contains(c.Message, "resumes at")
	}); err != nil {
		return err
	}
	f, err := d.get(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("   AutoPaused: %s\n", meta.FindStatusCondition(f.Status.Conditions, subflowv1.ConditionAutoPaused).Message)
	if f.Status.EffectiveState != subflowv1.StatePaused {
		return fmt.Errorf("resumed at the first healthy reading (%s), before resumeAfter", f.Status.EffectiveState)
	}
	fmt.Println("   still Paused: resumeAfter (30s) of health has not passed")
	if err := d.tick(ctx, 31*time.Second); err != nil {
		return err
	}
	return d.waitFor(ctx, "Running again after resumeAfter", func(f *subflowv1.SubscriptionFlow) bool {
		return ready(f) && f.Status.EffectiveState == subflowv1.StateRunning && f.Status.Consumers.Running == int32(len(d.w.pods))
	})
}

// setAvailable writes the database Deployment's Available condition.
func (d *demo) setAvailable(ctx context.Context, status corev1.ConditionStatus) error {
	db := &appsv1.Deployment{}
	if err := d.w.k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: dependencyName}, db); err != nil {
		return err
	}
	db.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: status, Reason: "Demo",
		LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	return d.w.k8s.Status().Update(ctx, db)
}

// tick moves the controller's clock on by d (past a condition's interval) and has the flow
// reconciled now.
func (d *demo) tick(ctx context.Context, by time.Duration) error {
	d.w.clock.Set(d.w.clock.Now().Add(by))
	fmt.Printf("   demo clock +%s\n", by)
	return d.reconcileNow(ctx)
}
