package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// API limits of spec.seek, checked here too so bad input fails before anything is sent.
const (
	maxSeekIDLength   = 128
	maxSeekPartitions = 1024
)

func (p *plugin) seekCommand() *cobra.Command {
	var (
		index      int64
		id         string
		partitions []string
		retry      bool
	)
	cmd := &cobra.Command{
		Use:   "seek NAME (--index N | --partition P=N ... | --retry) [--id ID]",
		Short: "Ask for a one-shot seek of the subscription to a broker-entry index (spec.seek)",
		Long: `Set spec.seek: the message with broker-entry index N is the next one delivered (an index
below the first entry means earliest, at or past the end means latest). A seek runs once per id;
without --id a new one is generated. Use --index for a non-partitioned topic, or --partition P=N
once per partition of a partitioned topic (spec.topic must name it).

A partitioned seek can fail half way: the partitions it moved stay moved, and status.seek lists
the others under failedPartitions. --retry seeks those again, to the same indexes, under a new
id, so that no partition is replayed twice.`,
		Example: "  kubectl subflow seek orders-ingest --index 120034\n" +
			"  kubectl subflow seek orders-ingest --partition 0=5000 --partition 1=7100 --id replay-2026-11-29\n" +
			"  kubectl subflow seek orders-ingest --retry",
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := oneName(args)
			if err != nil {
				return err
			}
			if retry {
				if cmd.Flags().Changed("index") || len(partitions) > 0 {
					return errors.New("--retry seeks the partitions the last seek did not move: give it without --index or --partition")
				}
				return p.retrySeek(cmd, name, id)
			}
			seek, err := seekRequest(cmd.Flags().Changed("index"), index, partitions, id, p.now)
			if err != nil {
				return err
			}
			c, flow, err := p.getFlow(cmd.Context(), name)
			if err != nil {
				return err
			}
			return p.patchSeek(cmd.Context(), c, flow, seek)
		},
	}
	cmd.Flags().Int64Var(&index, "index", 0, "target broker-entry index on a non-partitioned topic")
	cmd.Flags().StringArrayVar(&partitions, "partition", nil, "P=N: target index N on partition P (repeat per partition)")
	cmd.Flags().StringVar(&id, "id", "", "seek id; a new id asks for a new seek (default: generated)")
	cmd.Flags().BoolVar(&retry, "retry", false, "seek again the partitions the last seek did not move (status.seek.failedPartitions)")
	return cmd
}

// retrySeek asks for the partitions the flow's last seek did not move, under a new id.
func (p *plugin) retrySeek(cmd *cobra.Command, name, id string) error {
	c, flow, err := p.getFlow(cmd.Context(), name)
	if err != nil {
		return err
	}
	seek, err := retryRequest(flow.Status.Seek, id, p.now)
	if err != nil {
		return fmt.Errorf("%s/%s: %w", resourceName, name, err)
	}
	return p.patchSeek(cmd.Context(), c, flow, seek)
}

// retryRequest is spec.seek for the partitions a finished seek did not move.
func retryRequest(last *subflowv1.SeekStatus, id string, now func() time.Time) (*subflowv1.SeekSpec, error) {
	switch {
	case last == nil:
		return nil, errors.New("no seek has run: nothing to retry")
	case last.CompletionTime == nil:
		return nil, fmt.Errorf("seek %s has not finished yet: follow it with kubectl subflow status", last.ID)
	case len(last.FailedPartitions) == 0 && last.Message == "":
		return nil, fmt.Errorf("seek %s moved every partition: nothing to retry", last.ID)
	case len(last.FailedPartitions) == 0:
		return nil, fmt.Errorf("seek %s failed before it moved a cursor (%s): ask for it again with a new --id", last.ID, last.Message)
	}
	if id == "" {
		id = generatedSeekID(now())
	}
	seek := &subflowv1.SeekSpec{ID: id}
	for _, f := range last.FailedPartitions {
		seek.Partitions = append(seek.Partitions, subflowv1.PartitionIndex{Partition: f.Partition, Index: f.Index})
	}
	return seek, nil
}

// seekRequest validates the flags and builds spec.seek.
func seekRequest(hasIndex bool, index int64, partitions []string, id string, now func() time.Time) (*subflowv1.SeekSpec, error) {
	if hasIndex == (len(partitions) > 0) {
		return nil, errors.New("give exactly one of --index (non-partitioned topic) or --partition P=N (partitioned topic)")
	}
	if id == "" {
		id = generatedSeekID(now())
	}
	if len(id) > maxSeekIDLength {
		return nil, fmt.Errorf("--id is %d characters long, at most %d are allowed", len(id), maxSeekIDLength)
	}
	seek := &subflowv1.SeekSpec{ID: id}
	if hasIndex {
		if index < 0 {
			return nil, fmt.Errorf("--index must be 0 or more, got %d", index)
		}
		seek.Index = &index
		return seek, nil
	}
	parsed, err := parsePartitions(partitions)
	seek.Partitions = parsed
	return seek, err
}

func parsePartitions(values []string) ([]subflowv1.PartitionIndex, error) {
	if len(values) > maxSeekPartitions {
		return nil, fmt.Errorf("at most %d --partition values are allowed, got %d", maxSeekPartitions, len(values))
	}
	seen := map[int32]bool{}
	out := make([]subflowv1.PartitionIndex, 0, len(values))
	for _, v := range values {
		pi, err := parsePartition(v)
		if err != nil {
			return nil, err
		}
		if seen[pi.Partition] {
			return nil, fmt.Errorf("--partition %d is given twice", pi.Partition)
		}
		seen[pi.Partition] = true
		out = append(out, pi)
	}
	return out, nil
}

func parsePartition(value string) (subflowv1.PartitionIndex, error) {
	bad := fmt.Errorf("--partition %q: want P=N with partition P and index N, both 0 or more, e.g. 0=5000", value)
	ps, ns, ok := strings.Cut(value, "=")
	if !ok {
		return subflowv1.PartitionIndex{}, bad
	}
	partition, err := strconv.ParseInt(strings.TrimSpace(ps), 10, 32)
	if err != nil || partition < 0 || partition > math.MaxInt32 {
		return subflowv1.PartitionIndex{}, bad
	}
	index, err := strconv.ParseInt(strings.TrimSpace(ns), 10, 64)
	if err != nil || index < 0 {
		return subflowv1.PartitionIndex{}, bad
	}
	return subflowv1.PartitionIndex{Partition: int32(partition), Index: index}, nil
}

// generatedSeekID is readable in status and unique even when two people seek in the same second.
func generatedSeekID(now time.Time) string {
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix) // crypto/rand.Read never fails
	return "seek-" + now.UTC().Format("20060102-150405") + "-" + hex.EncodeToString(suffix)
}

// patchSeek writes spec.seek into the flow as read, refusing an id the flow already carries (it
// would not run again). The patch names the resourceVersion read, so a concurrent change makes
// it fail instead of being overwritten.
func (p *plugin) patchSeek(ctx context.Context, c client.Client, flow *subflowv1.SubscriptionFlow, seek *subflowv1.SeekSpec) error {
	if flow.Spec.Seek != nil && flow.Spec.Seek.ID == seek.ID {
		return fmt.Errorf("spec.seek.id is already %q: a seek runs once per id; give a new --id or leave it out", seek.ID)
	}
	body, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": flow.ResourceVersion},
		// The unused form is sent as null (nil marshals so): a merge patch would otherwise keep
		// it from an earlier seek, and the API server refuses index and partitions together.
		"spec": map[string]any{"seek": map[string]any{"id": seek.ID, "index": seek.Index, "partitions": seek.Partitions}},
	})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, flow, client.RawPatch(types.MergePatchType, body)); err != nil {
		return err
	}
	fmt.Fprintf(p.stdout, "%s/%s seek requested: id %s, %s (follow it with: kubectl subflow status %s -n %s)\n",
		resourceName, flow.Name, seek.ID, describeTargets(seek), flow.Name, flow.Namespace)
	return nil
}

func describeTargets(seek *subflowv1.SeekSpec) string {
	if seek.Index != nil {
		return fmt.Sprintf("index %d", *seek.Index)
	}
	parts := make([]string, len(seek.Partitions))
	for i, pi := range seek.Partitions {
		parts[i] = fmt.Sprintf("%d=%d", pi.Partition, pi.Index)
	}
	return "partitions " + strings.Join(parts, ", ")
}
