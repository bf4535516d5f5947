# syntax=docker/dockerfile:1
# One image for every gpufrac component: `gpufrac webhook`, `gpufrac agent`, `gpufrac certs rotate`, ...
#   docker build -t <registry>/gpufrac:<tag> .      (or buildah bud; or make image, which needs no registry at all)
# A clean clone is all it needs: the gRPC stubs are generated here from the protos vendored in proto/.
#
# BASE is a slim Python 3.11 on Debian bookworm, pinned by digest (the multi-arch index of
# python:3.11-slim-bookworm; refresh with `skopeo inspect --format '{{.Digest}}' docker://python:3.11-slim-bookworm`
# or `docker buildx imagetools inspect`). `make image` makes a base of its own from Debian's packages and passes it
# by name (--build-arg BASE=docker.io/library/python:3.11-slim-bookworm), so the file is the same for both.
ARG BASE=docker.io/library/python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml constraints.txt ./
# The dependencies first, in their own layer (they change less often than the code). They all come as wheels
# (no compiler), in the versions the tests ran with. pip-ca: an extra CA bundle for a package index behind a
# TLS-inspecting proxy (make image passes the host's).
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && python3 -m venv /opt/gpufrac \
 && python3 -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
      > requirements.txt \
 && /opt/gpufrac/bin/pip install --no-cache-dir --disable-pip-version-check -c constraints.txt -r requirements.txt \
 && python3 -m venv /opt/stubs \
 && /opt/stubs/bin/pip install --no-cache-dir --disable-pip-version-check -c constraints.txt grpcio-tools
COPY README.md LICENSE ./
COPY proto ./proto
COPY hack/grpc-stubs.sh hack/sbom.py ./hack/
COPY gpufrac ./gpufrac
# The stubs from the vendored protos (grpcio-tools in a virtualenv of its own: the image does not carry it), then
# gpufrac itself, and the SBOM of what the final image holds: this venv's distributions and the base's packages.
ARG VERSION=0.2.0
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && PYTHON=/opt/stubs/bin/python bash hack/grpc-stubs.sh generate \
 && /opt/gpufrac/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps . \
 && /opt/gpufrac/bin/pip uninstall -y --disable-pip-version-check pip \
 && python3 -m compileall -q /opt/gpufrac \
 && python3 hack/sbom.py --version "$VERSION" --out /sbom/gpufrac.spdx.json \
      --site-packages "$(/opt/gpufrac/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"

FROM ${BASE}
ARG VERSION=0.2.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/gpufrac/gpufrac
LABEL org.opencontainers.image.title="gpufrac" \
      org.opencontainers.image.description="Fractional NVIDIA GPUs on Kubernetes: admission webhook and node agent" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/gpufrac /opt/gpufrac
COPY --from=build /src/LICENSE /usr/share/doc/gpufrac/LICENSE
COPY --from=build /sbom/gpufrac.spdx.json /usr/share/doc/gpufrac/sbom.spdx.json
# A read-only root filesystem: nothing writes bytecode, and HOME (gunicorn's control socket) is /tmp, an
# emptyDir in the chart.
ENV PATH=/opt/gpufrac/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The webhook and the certificate jobs run as this user; the agent's DaemonSet runs as root (it reads other
# processes' /proc entries and runs the MPS daemons).
USER 65532:65532
ENTRYPOINT ["gpufrac"]
CMD ["--help"]
