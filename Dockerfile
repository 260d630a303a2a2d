# syntax=docker/dockerfile:1
# echelon in a container: the build stage installs the project's build dependencies
# (scripts/install-deps.sh), builds the binary and its Debian package; the runtime stage is a
# bare Debian 12 with that package installed by apt, so the runtime libraries are exactly the
# package's Depends (computed by dpkg-shlibdeps) and no compiler comes along.
#
#   docker build -t echelon:0.3.0 .
#   docker run --rm echelon:0.3.0 --version
#   mkdir -p runs && docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/runs:/var/lib/echelon/runs" \
#       echelon:0.3.0 train /usr/share/echelon/configs/math-tiny.yaml
#
# The image is about 1.3 GB, most of it what Debian's LibTorch depends on. BuildKit (the
# default builder) keeps the ccache of the build stage between builds.
#
# Kubernetes and Slurm set-ups around this image: deploy/ (docs/DEPLOY.md).

FROM debian:12 AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# The dependency layer is rebuilt only when the package list changes.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN --mount=type=cache,target=/root/.cache/ccache \
    CCACHE_BASEDIR=/src cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release \
 && CCACHE_BASEDIR=/src cmake --build /build -j"$(nproc)" --target echelon \
 && cd /build && cpack -G DEB -B /packages

FROM debian:12
ENV DEBIAN_FRONTEND=noninteractive
COPY --from=build /packages/echelon_*.deb /tmp/
RUN apt-get update \
 && apt-get install -y --no-install-recommends /tmp/echelon_*.deb \
 && rm -rf /var/lib/apt/lists/* /tmp/echelon_*.deb \
 && useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/echelon echelon
USER 10001:10001
WORKDIR /var/lib/echelon
# gRPC to actors, the snapshot broadcast, Prometheus metrics (docs/DEPLOY.md, "Firewall").
EXPOSE 7700 7701 9400
ENTRYPOINT ["echelon"]
CMD ["--help"]
