// Command protogen generates Go code from .proto files with protoc-gen-go's own generator and a
// protobuf compiler written in Go, so that `make generate` needs nothing but the Go toolchain
// (no protoc). It writes <name>.pb.go next to each .proto, as protoc's
// --go_opt=paths=source_relative does.
//
//	go run ./hack/protogen wire.proto
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/bufbuild/protocompile"
	gengo "google.golang.org/protobuf/cmd/protoc-gen-go/internal_gengo"
	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: protogen FILE.proto...")
		os.Exit(2)
	}
	if err := generate(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "protogen:", err)
		os.Exit(1)
	}
}

func generate(ctx context.Context, files []string) error {
	compiler := protocompile.Compiler{
		Resolver:       protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{"."}}),
		SourceInfoMode: protocompile.SourceInfoStandard, // comments carry over into the Go code
	}
	compiled, err := compiler.Compile(ctx, files...)
	if err != nil {
		return err
	}
	req := &pluginpb.CodeGeneratorRequest{FileToGenerate: files, Parameter: ptr("paths=source_relative")}
	seen := map[string]bool{}
	for _, f := range compiled {
		req.ProtoFile = appendWithImports(req.ProtoFile, f, seen)
	}
	gen, err := protogen.Options{}.New(req)
	if err != nil {
		return err
	}
	for _, f := range gen.Files {
		if f.Generate {
			gengo.GenerateFile(gen, f)
		}
	}
	gen.SupportedFeatures = gengo.SupportedFeatures
	resp := gen.Response()
	if resp.Error != nil {
		return fmt.Errorf("protoc-gen-go: %s", resp.GetError())
	}
	for _, out := range resp.File {
		if err := os.WriteFile(filepath.Clean(out.GetName()), []byte(out.GetContent()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// appendWithImports adds f after everything it imports, each file once, as protoc orders them.
func appendWithImports(out []*descriptorpb.FileDescriptorProto, f protoreflect.FileDescriptor, seen map[string]bool) []*descriptorpb.FileDescriptorProto {
	if seen[f.Path()] {
		return out
	}
	seen[f.Path()] = true
	imports := f.Imports()
	for i := range imports.Len() {
		out = appendWithImports(out, imports.Get(i).FileDescriptor, seen)
	}
	return append(out, protodesc.ToFileDescriptorProto(f))
}

func ptr[T any](v T) *T { return &v }
