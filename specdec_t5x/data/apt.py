"""Fetches Debian's bookworm `main` archive index with the machine's own `apt-get`.

The mirror comes from the machine's apt configuration (`/etc/apt/sources.list` in the one-line
format and `/etc/apt/sources.list.d/*.list` / `*.sources` in the deb822 format): the first enabled
`deb` source that lists suite `bookworm` with component `main`, else the first one signed by the
Debian archive keyring. `SPECDEC_DEBIAN_MIRROR` overrides it (a local mirror or proxy URL).
apt then runs with a private configuration and private lists, cache and sources folders, so the
system's apt state is not touched.

Environment: `SPECDEC_DEBIAN_MIRROR` (mirror URL), `SPECDEC_APT_GET` (path to apt-get when not on
`PATH`), `SPECDEC_DEBIAN_KEYRING` (default /usr/share/keyrings/debian-archive-keyring.gpg).
"""

import logging
import os
import pathlib
import shlex
import shutil
import subprocess
import tempfile

from specdec_t5x.data import debian

logger = logging.getLogger(__name__)

SUITE = "bookworm"
COMPONENT = "main"
ARCHITECTURE = "amd64"  # Pinned: the Packages file decides the source mapping, hence the splits.
DEFAULT_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
APT_ETC = "/etc/apt"
# Index files fetched, by the suffix of apt's file name in its lists folder.
INDEX_FILES = {
    "Packages": f"_dists_{SUITE}_{COMPONENT}_binary-{ARCHITECTURE}_Packages",
    "Translation-en": f"_dists_{SUITE}_{COMPONENT}_i18n_Translation-en",
    "Translation-de": f"_dists_{SUITE}_{COMPONENT}_i18n_Translation-de",
    "InRelease": f"_dists_{SUITE}_InRelease",
}


def _one_line_sources(text: str) -> list[dict[str, list[str]]]:
    """Entries of a one-line `sources.list` (`deb [opt=val ...] URI suite [component ...]`)."""
    entries = []
    for line in text.splitlines():
        words = shlex.split(line.split("#", 1)[0])
        if len(words) < 3:
            continue
        options = {}
        if words[1].startswith("["):  # "[arch=amd64 signed-by=/path]" (maybe split at spaces)
            end = next(i for i, w in enumerate(words) if w.endswith("]"))
            for option in " ".join(words[1 : end + 1]).strip("[]").split():
                key, _, value = option.partition("=")
                options[key.lower()] = value
            words = [words[0], *words[end + 1 :]]
        if len(words) >= 3:
            entries.append(
                {
                    "types": [words[0]],
                    "uris": [words[1]],
                    "suites": [words[2]],
                    "components": words[3:],
                    "signed-by": [options.get("signed-by", "")],
                }
            )
    return entries


def _deb822_sources(text: str) -> list[dict[str, list[str]]]:
    """Enabled entries of a deb822 `.sources` file (Types, URIs, Suites, Components, Signed-By)."""
    entries = []
    for stanza in debian.parse_stanzas(text):
        fields = {k.lower(): v for k, v in stanza.items()}
        if fields.get("enabled", "yes").strip().lower() == "no":
            continue
        entries.append(
            {
                key: fields.get(key, "").split()
                for key in ("types", "uris", "suites", "components", "signed-by")
            }
        )
    return entries


def apt_sources(etc_apt: str | os.PathLike = APT_ETC) -> list[dict[str, list[str]]]:
    """All enabled source entries of the apt configuration under `etc_apt`, in apt's file order.

    Reads `sources.list`, then `sources.list.d/*.list` (one-line format) and `*.sources` (deb822)
    in name order; files apt ignores (other extensions, e.g. `.disabled`) are skipped.

    Returns:
      Entries {'types', 'uris', 'suites', 'components', 'signed-by'} -> lists of strings.

    Raises:
      ValueError: a `.sources` file that is not deb822 (the message names the line).
    """
    etc = pathlib.Path(etc_apt)
    entries = []
    if (etc / "sources.list").is_file():
        entries += _one_line_sources((etc / "sources.list").read_text())
    parts = etc / "sources.list.d"
    for path in sorted(parts.iterdir()) if parts.is_dir() else []:
        if path.suffix == ".list":
            entries += _one_line_sources(path.read_text())
        elif path.suffix == ".sources":
            try:
                entries += _deb822_sources(path.read_text())
            except ValueError as e:
                raise ValueError(f"{path}: {e}") from e
    return entries


def debian_mirror(etc_apt: str | os.PathLike = APT_ETC) -> str:
    """The Debian mirror URL: `$SPECDEC_DEBIAN_MIRROR`, else the machine's apt configuration.

    Of the enabled `deb` entries (see `apt_sources`), the first listing suite `bookworm` with
    component `main`; else the first signed by the Debian archive keyring (a Debian mirror serves
    every suite).

    Raises:
      RuntimeError: no such entry; the message says where it looked and what to set.
    """
    override = os.environ.get("SPECDEC_DEBIAN_MIRROR")
    if override:
        return override.rstrip("/")
    debs = [e for e in apt_sources(etc_apt) if "deb" in e["types"] and e["uris"]]
    for entry in debs:
        if SUITE in entry["suites"] and COMPONENT in entry["components"]:
            return entry["uris"][0].rstrip("/")
    for entry in debs:
        if any("debian-archive-keyring" in key for key in entry["signed-by"]):
            return entry["uris"][0].rstrip("/")
    raise RuntimeError(
        f"no Debian mirror in the apt configuration under {etc_apt} (no 'deb' source for "
        f"{SUITE} {COMPONENT}, none signed by the Debian archive keyring): set "
        "SPECDEC_DEBIAN_MIRROR to a Debian mirror URL (the folder holding dists/)."
    )


def _apt_get() -> str:
    """Finds apt-get, or raises a RuntimeError that says what to install or set."""
    apt_get = os.environ.get("SPECDEC_APT_GET") or shutil.which("apt-get")
    if not apt_get or not os.access(apt_get, os.X_OK):
        raise RuntimeError(
            "apt-get not found: the corpora are fetched from Debian's archive index by apt itself. "
            "Run on Debian/Ubuntu (package `apt`), or set SPECDEC_APT_GET=/path/to/apt-get."
        )
    return apt_get


def fetch_indexes(dest_dir: pathlib.Path, mirror: str | None = None) -> dict[str, pathlib.Path]:
    """Fetches bookworm `main` Packages, Translation-en/-de and InRelease with `apt-get update`.

    apt runs with a private configuration (`-c FILE`) and private lists, cache and sources folders
    in a temporary folder under `dest_dir`; the system's apt state and hooks are left alone.
    Signatures are checked against the Debian archive keyring.

    Args:
      dest_dir: folder that receives the files, named as in `INDEX_FILES` (overwritten).
      mirror: Debian mirror URL; `debian_mirror()` when None.

    Returns:
      {name: path} for each of `INDEX_FILES`.

    Raises:
      RuntimeError: apt-get, the keyring or a mirror is missing, apt-get fails, or a file did not
        arrive.
    """
    apt_get = _apt_get()
    keyring = os.environ.get("SPECDEC_DEBIAN_KEYRING") or DEFAULT_KEYRING
    if not os.path.exists(keyring):
        raise RuntimeError(
            f"Debian archive keyring {keyring} not found: install the `debian-archive-keyring` "
            "package or set SPECDEC_DEBIAN_KEYRING=/path/to/debian-archive-keyring.gpg."
        )
    mirror = mirror or debian_mirror()
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".apt-", dir=dest_dir) as work:
        work = pathlib.Path(work)
        lists, cache, parts = work / "lists", work / "cache", work / "sources.list.d"
        for folder in (lists / "partial", cache / "archives" / "partial", parts):
            folder.mkdir(parents=True)
        (parts / "debian.sources").write_text(
            f"Types: deb\nURIs: {mirror}\nSuites: {SUITE}\nComponents: {COMPONENT}\n"
            f"Architectures: {ARCHITECTURE}\nTargets: Packages Translations\nSigned-By: {keyring}\n"
        )
        config = work / "apt.conf"
        config.write_text(
            f'Dir::State::Lists "{lists}";\nDir::Cache "{cache}";\n'
            'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
            f'Dir::Etc::SourceList "/dev/null";\nDir::Etc::SourceParts "{parts}";\n'
            '#clear Acquire::Languages;\nAcquire::Languages { "en"; "de"; };\n'
            'Acquire::GzipIndexes "false";\n'
            "#clear APT::Update::Pre-Invoke;\n#clear APT::Update::Post-Invoke;\n"
            "#clear APT::Update::Post-Invoke-Success;\n"
            + ('APT::Sandbox::User "root";\n' if os.geteuid() == 0 else "")
        )
        logger.info(
            "Fetching Debian %s/%s index from %s with %s", SUITE, COMPONENT, mirror, apt_get
        )
        env = {**os.environ, "LC_ALL": "C"}
        proc = subprocess.run(
            [apt_get, "-c", str(config), "update"], capture_output=True, text=True, env=env
        )
        paths = {}
        for name, suffix in INDEX_FILES.items():
            found = sorted(lists.glob("*" + suffix))
            if proc.returncode != 0 or not found:
                raise RuntimeError(
                    f"apt-get update (exit {proc.returncode}) did not deliver {name}:\n"
                    f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
                )
            paths[name] = dest_dir / name
            shutil.move(found[0], paths[name])
    return paths
