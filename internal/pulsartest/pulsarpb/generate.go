// Package pulsarpb holds the Go code generated from wire.proto, the subset of
// the Pulsar binary protocol that the test broker speaks.
package pulsarpb

//go:generate sh -c "protoc --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --go_out=. --go_opt=paths=source_relative wire.proto"
