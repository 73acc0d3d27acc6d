# Build the controller as a static binary.
FROM golang:1.26 AS builder
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY main.go ./
COPY api/ api/
COPY controllers/ controllers/
COPY agent/ agent/
COPY webhooks/ webhooks/
COPY internal/pulsarpb/ internal/pulsarpb/
COPY cmd/subflow-sidecar/ cmd/subflow-sidecar/
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -ldflags="-s -w" -o /out/subflow .
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -ldflags="-s -w" -o /out/subflow-sidecar ./cmd/subflow-sidecar

# The sidecar for consumers in any language: docker build --target sidecar.
FROM gcr.io/distroless/static:nonroot AS sidecar
COPY --from=builder /out/subflow-sidecar /subflow-sidecar
USER 65532:65532
ENTRYPOINT ["/subflow-sidecar"]

# The controller (the default target). Distroless static, non-root: nothing but the binary
# (time zones are embedded in it).
FROM gcr.io/distroless/static:nonroot
COPY --from=builder /out/subflow /subflow
USER 65532:65532
ENTRYPOINT ["/subflow"]
