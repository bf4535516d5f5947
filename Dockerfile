# syntax=docker/dockerfile:1
# One image for every gpufrac component: `gpufrac webhook`, `gpufrac agent`, `gpufrac certs rotate`, ...
#   docker build -t <registry>/gpufrac:<tag> .      (or: make image, which needs no registry at all)
# BASE is a slim Python 3.11 on Debian bookworm. `make image` builds one locally from Debian's packages under
# this same name (e2e/build-image.sh), so the file is the same for both.
ARG BASE=docker.io/library/python:3.11-slim-bookworm

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
 && /opt/gpufrac/bin/pip install --no-cache-dir --disable-pip-version-check -c constraints.txt -r requirements.txt
COPY README.md ./
COPY gpufrac ./gpufrac
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && /opt/gpufrac/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps . \
 && /opt/gpufrac/bin/pip uninstall -y --disable-pip-version-check pip \
 && python3 -m compileall -q /opt/gpufrac

FROM ${BASE}
COPY --from=build /opt/gpufrac /opt/gpufrac
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
