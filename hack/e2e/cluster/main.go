// Command cluster starts the end-to-end suite's single-node Kubernetes by hand, for a look
// around, and cleans up after any run:
//
//	go run ./hack/e2e/cluster up [image.tar...]   # until Ctrl-C; prints the kubeconfig's path
//	go run ./hack/e2e/cluster clean               # removes what a killed run left behind
//
// It needs root, the runtime from Debian's packages and the binaries of
// hack/e2e/node-binaries.sh (make e2e-cluster does all of that).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/subflow-dev/subflow/internal/testing/realcluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func run() error {
	runDir := filepath.Join(os.TempDir(), "subflow-e2e")
	if len(os.Args) < 2 {
		return fmt.Errorf("usage: cluster up [image.tar...] | cluster clean")
	}
	switch os.Args[1] {
	case "clean":
		return realcluster.Clean(runDir)
	case "up":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		c, err := realcluster.Start(ctx, realcluster.Options{RunDir: runDir, Binaries: os.Getenv("SUBFLOW_NODE_BINARIES"),
			Images: os.Args[2:], Log: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }})
		if err != nil {
			return err
		}
		fmt.Printf("export KUBECONFIG=%s\n", c.Kubeconfig)
		fmt.Fprintln(os.Stderr, "cluster: Ctrl-C stops it and removes every trace")
		<-ctx.Done()
		if err := c.Stop(); err != nil {
			return err
		}
		return realcluster.CheckClean(runDir, c.Before)
	}
	return fmt.Errorf("unknown command %q", os.Args[1])
}
