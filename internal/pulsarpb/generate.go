// Package pulsarpb holds the Go code generated from wire.proto, the subset of
// the Pulsar binary protocol that the test broker, the wire recorder and the sidecar parse.
package pulsarpb

// hack/protogen compiles the .proto in Go and runs protoc-gen-go's generator: no protoc needed.
//go:generate go run ../../hack/protogen wire.proto
