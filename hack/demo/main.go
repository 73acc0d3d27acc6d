// Command demo starts a local control plane, installs the SubscriptionFlow CRD and the samples,
// and shows them as kubectl would. The full pause/seek/resume walk-through with the test broker
// and agents grows here.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testenv"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	fmt.Println("== starting a local control plane (kube-apiserver + etcd)")
	env, cfg, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	scheme := runtime.NewScheme()
	if err := subflowv1.AddToScheme(scheme); err != nil {
		return err
	}
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "samples", "subflow_*.yaml"))
	if err != nil {
		return err
	}
	for _, file := range files {
		if err := apply(ctx, k8s, file); err != nil {
			return err
		}
		fmt.Println("applied", filepath.Base(file))
	}
	var flows subflowv1.SubscriptionFlowList
	if err := k8s.List(ctx, &flows, client.InNamespace("default")); err != nil {
		return err
	}
	fmt.Printf("\n%-16s %-9s %-12s %s\n", "NAME", "STATE", "SUBSCRIPTION", "WINDOWS")
	for _, f := range flows.Items {
		fmt.Printf("%-16s %-9s %-12s %d\n", f.Name, f.Spec.State, f.Spec.Subscription, len(f.Spec.MaintenanceWindows))
	}
	return nil
}

func apply(ctx context.Context, k8s client.Client, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &obj.Object); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	obj.SetNamespace("default")
	return k8s.Create(ctx, obj)
}
