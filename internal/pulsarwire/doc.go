// Package pulsarwire is the Pulsar binary protocol as the sidecar, the test broker and the wire
// recorder speak it: the Go code generated from wire.proto (the subset of the protocol's
// messages they read) and the framing around it, each rule once - a frame's size field and its
// bound, the command and payload it splits into, a payload's broker-entry, checksum and
// metadata sections, and their encoding.
//
// What one peer refuses or tolerates beyond the framing stays with it: the sidecar's decode
// rules and memory-bounded reader, the test broker's limits, the recorder's leniency.
package pulsarwire

// hack/protogen compiles the .proto in Go and runs protoc-gen-go's generator: no protoc needed.
//go:generate go run ../../hack/protogen wire.proto
