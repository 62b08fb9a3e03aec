# Lacquer's container image: built in a full Rust image, run from a distroless one (glibc and
# libgcc only, no shell) as a non-root user.
#
#   docker build -t lacquer .
#   docker run --rm -p 6081:6081 -v $PWD/lacquer.toml:/etc/lacquer/lacquer.toml:ro lacquer
#
# `docker kill -s HUP` reloads the config (memory tier kept); `docker stop` sends SIGTERM, which
# drains: give it `--stop-timeout` above the config's shutdown_timeout (10 s by default).
# The image also carries `demo-origin` (ENTRYPOINT ["demo-origin"]), for the compose example.

FROM rust:1-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin lacquer --bin demo-origin \
    && mkdir -p /out \
    && cp target/release/lacquer target/release/demo-origin /out/ \
    && strip /out/lacquer /out/demo-origin

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/lacquer /out/demo-origin /usr/bin/
COPY packaging/lacquer.toml /etc/lacquer/lacquer.toml
USER nonroot:nonroot
EXPOSE 6081 6082
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/lacquer"]
CMD ["--config", "/etc/lacquer/lacquer.toml"]
