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

# Distroless static, non-root: nothing but the binary (time zones are embedded in it).
FROM gcr.io/distroless/static:nonroot AS base
USER 65532:65532

# The sidecar for consumers in any language: docker build --target sidecar.
FROM base AS sidecar
COPY --from=builder /out/subflow-sidecar /subflow-sidecar
ENTRYPOINT ["/subflow-sidecar"]

# The controller (the default target).
FROM base
COPY --from=builder /out/subflow /subflow
ENTRYPOINT ["/subflow"]
