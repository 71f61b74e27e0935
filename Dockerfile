# syntax=docker/dockerfile:1
# sidecar-injector's image: the binary alone on distroless (no shell, no package manager), as a non-root user.
#   docker build -t sidecar-injector:dev .
#   kind load docker-image sidecar-injector:dev        (kind; minikube: minikube image load sidecar-injector:dev)
# Then deploy it (README, "Deploy"):
#   sidecar-injector certs --image sidecar-injector:dev --out my-injector && kubectl apply -k my-injector

# Build: the dist profile (fat LTO, one codegen unit), profile-guided: manifests/pgo-build.sh builds it
# instrumented, serves the load harness's reviews with it and builds it again with what that recorded (the load
# harness is built to drive it, and left out of the image). Without a Docker engine, manifests/image.sh builds the
# same image with buildah (it reads USER, ENTRYPOINT, CMD, EXPOSE and LABEL from this stage's last lines).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    manifests/pgo-build.sh --profile dist --out /sidecar-injector

# Run: glibc and libgcc (the `cc` flavour of distroless; mimalloc and aws-lc are linked in), nothing else.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /sidecar-injector /sidecar-injector
# distroless's `nonroot` user; the Deployment runs as the same uid (runAsUser: 65532).
USER 65532:65532
# 8443: the webhook (HTTPS); 9090: /metrics, /healthz, /readyz (plain HTTP).
EXPOSE 8443 9090
LABEL org.opencontainers.image.title="sidecar-injector"
LABEL org.opencontainers.image.description="A Kubernetes mutating admission webhook that injects a templated sidecar"
LABEL org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/sidecar-injector"]
CMD ["serve"]
