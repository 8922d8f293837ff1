"""The JVM jars Apache Spark needs for Delta (and JDBC), resolved once with Maven into a cache.

PySpark's pip distribution carries a complete Spark 4.0 (``pyspark/jars``) but no Delta
Lake: ``spark/pom.xml`` lists what is missing (delta-spark, delta-storage, the
PostgreSQL driver; the ``delta-connect`` profile adds Delta's Spark Connect plugin).
The first call runs ``mvn dependency:copy-dependencies`` into
``<root>/<key>``, where ``<root>`` is ``$HEARTBEAT_SPARK_JARS_DIR`` or
``~/.cache/heartbeat/spark-jars`` and ``<key>`` hashes the pom and the profiles, so an
edited pom never reuses stale jars. Later calls only list that folder.

Heartbeat's own JVM code, a local file system without a child process per file
(``spark/src/main/java``), is compiled once with the JDK's ``javac`` into
``<root>/local-fs-<key>`` (:func:`local_file_system_jar`); without a JDK Spark runs on
Hadoop's, only slower.

Invariants: a ``<root>/<key>`` folder exists only when complete (it is filled under a
temporary name and renamed into place); no returned jar duplicates an artifact PySpark
already ships (that would put two versions of a class on one classpath).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.core.settings import package_project_dir, read_environment

log = logging.getLogger(__name__)

POM = package_project_dir() / "spark" / "pom.xml"
#: Heartbeat's local file system for Spark (see the source's comment) and the class Hadoop is told to use
FILE_SYSTEM_SOURCE = POM.parent / "src" / "main" / "java" / "heartbeat" / "spark" / "LocalFileSystem.java"
FILE_SYSTEM_CLASS = "heartbeat.spark.LocalFileSystem"
#: how long compiling it may take (one small file; a cold JDK starts in seconds)
COMPILE_TIMEOUT_S = 180
DELTA_CONNECT_PROFILE = "delta-connect"
#: how long one Maven resolution may take (a cold ~/.m2 downloads ~10 MB)
RESOLVE_TIMEOUT_S = 600
_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-\d[^-]*(-[A-Za-z][\w.]*)*\.jar$")


class SparkJarsError(HeartbeatError):
    """The Delta jars could not be resolved (no Maven/Java, or Maven Central said no)."""


def cache_root() -> Path:
    """Where resolved jar sets live: ``$HEARTBEAT_SPARK_JARS_DIR`` or ``~/.cache/heartbeat/spark-jars``."""
    explicit = read_environment().spark_jars_dir
    return explicit or Path.home() / ".cache" / "heartbeat" / "spark-jars"


def cache_key(pom: Path, profiles: tuple[str, ...] = ()) -> str:
    """16 hex digits naming one (pom content, profiles) pair; stable across machines."""
    digest = hashlib.sha256(pom.read_bytes())
    digest.update(",".join(sorted(profiles)).encode())
    return digest.hexdigest()[:16]


def spark_jars(*, delta_connect: bool = False, pom: Path = POM) -> list[Path]:
    """The jars to put on Spark's classpath (``spark.jars`` / ``--jars``), resolving them on first use.

    ``delta_connect`` adds Delta's Spark Connect server plugin. Raises SparkJarsError with
    Maven's own words when resolution fails.
    """
    profiles = (DELTA_CONNECT_PROFILE,) if delta_connect else ()
    folder = cache_root() / cache_key(pom, profiles)
    if not folder.is_dir():
        _resolve_into(folder, pom, profiles)
    return _without_pyspark_duplicates(sorted(folder.glob("*.jar")))


def delta_connect_available(pom: Path = POM) -> bool:
    """Whether Delta's Connect plugin jars can be had; a failed attempt is remembered per pom.

    The memory is a ``<key>.unavailable`` file beside the cache folders holding Maven's
    error; delete it to try again.
    """
    profiles = (DELTA_CONNECT_PROFILE,)
    marker = cache_root() / f"{cache_key(pom, profiles)}.unavailable"
    if marker.exists():
        return False
    _require_tools()  # a missing tool is not remembered as "unavailable"
    try:
        spark_jars(delta_connect=True, pom=pom)
        return True
    except SparkJarsError as exc:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(exc), encoding="utf-8")
        log.warning("Delta Connect plugin unavailable: %s", str(exc).splitlines()[0])
        return False


def delta_connect_unavailable_reason(pom: Path = POM) -> str | None:
    """Maven's error from the last failed attempt to resolve the Delta Connect plugin, if any."""
    marker = cache_root() / f"{cache_key(pom, (DELTA_CONNECT_PROFILE,))}.unavailable"
    return marker.read_text(encoding="utf-8") if marker.exists() else None


def local_file_system_jar(source: Path = FILE_SYSTEM_SOURCE) -> Path | None:
    """The jar of Heartbeat's local file system for Spark, compiled on first use; None without a JDK.

    One jar per source (``<root>/local-fs-<key>``, filled under a temporary name and renamed into
    place). No ``javac``: None, asked again next time (installing a JDK is enough). A failed compile
    is remembered in a ``.unavailable`` file beside it, as an unavailable Delta Connect plugin is.
    """
    key = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    folder = cache_root() / f"local-fs-{key}"
    jar = folder / "heartbeat-local-fs.jar"
    marker = folder.with_name(f"{folder.name}.unavailable")
    if jar.is_file():
        return jar
    javac = _javac()
    if javac is None or marker.exists():
        return None
    try:
        _compile_into(folder, jar.name, source, javac)
    except SparkJarsError as exc:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(exc), encoding="utf-8")
        log.warning("Spark keeps Hadoop's local file system: %s", str(exc).splitlines()[0])
        return None
    return jar


def _javac() -> str | None:
    found = shutil.which("javac")
    home = os.environ.get("JAVA_HOME")
    if found is None and home and (Path(home) / "bin" / "javac").exists():
        found = str(Path(home) / "bin" / "javac")
    return found


def _compile_into(folder: Path, jar_name: str, source: Path, javac: str) -> None:
    """Compile ``source`` against the Hadoop PySpark ships and jar it into ``folder`` (filled in place)."""
    hadoop = sorted((_pyspark_dir() / "jars").glob("hadoop-client-api-*.jar"))
    if not hadoop:
        raise SparkJarsError("PySpark ships no hadoop-client-api jar to compile against")
    with _filled_in_place(folder) as staging:
        classes = staging / "classes"
        command = [javac, "--release", "17", "-nowarn", "-cp", str(hadoop[-1]), "-d", str(classes), str(source)]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SparkJarsError(f"javac could not run: {exc}") from exc
        if proc.returncode != 0:
            raise SparkJarsError(f"javac could not compile {source.name}:\n{(proc.stdout + proc.stderr).strip()}")
        with zipfile.ZipFile(staging / jar_name, "w") as jar:
            for compiled in sorted(classes.rglob("*.class")):
                jar.write(compiled, compiled.relative_to(classes).as_posix())
        shutil.rmtree(classes)


@contextlib.contextmanager
def _filled_in_place(folder: Path) -> Iterator[Path]:
    """A temporary sibling of ``folder`` to fill; renamed to ``folder`` when the block succeeds (atomic),
    removed otherwise. Another process that finished first keeps its folder: it is as good as ours."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        yield staging
        try:
            staging.rename(folder)
        except OSError:
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _resolve_into(folder: Path, pom: Path, profiles: tuple[str, ...]) -> None:
    """Run Maven into ``folder`` (filled in place)."""
    mvn = _require_tools()
    started = time.monotonic()
    with _filled_in_place(folder) as staging:
        command = [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(pom), "dependency:copy-dependencies",
                   f"-DoutputDirectory={staging}"]
        if profiles:
            command.append("-P" + ",".join(profiles))
        proc = subprocess.run(command, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S)
        if proc.returncode != 0:
            raise SparkJarsError(_maven_failure(proc.stdout + proc.stderr, profiles))
    log.info("resolved Spark jars into %s in %.1fs", folder, time.monotonic() - started)


def _require_tools() -> str:
    """Path of ``mvn``; a clear error when Maven or Java is missing."""
    mvn = shutil.which("mvn")
    java = shutil.which("java") or (Path(os.environ.get("JAVA_HOME", "/nonexistent")) / "bin" / "java")
    if mvn is None or not Path(java).exists():
        missing = " and ".join(name for name, found in (("Maven (mvn)", mvn), ("Java 17 (java)", Path(java).exists()))
                               if not found)
        raise SparkJarsError(
            f"{missing} not found: Apache Spark with Delta needs them once to resolve the Delta jars "
            f"(apt-get install maven openjdk-17-jre-headless), or set HEARTBEAT_SPARK_JARS_DIR to a cache "
            f"that already holds them")
    return mvn


def _maven_failure(output: str, profiles: tuple[str, ...]) -> str:
    errors = [line.replace("[ERROR]", "").strip() for line in output.splitlines() if "[ERROR]" in line]
    errors = [e for e in errors if e and not e.startswith(("To see", "Re-run", "For more", "[Help"))]
    what = f"with profile(s) {', '.join(profiles)}" if profiles else ""
    return f"Maven could not resolve the Spark jars {what}:\n" + "\n".join(errors[:5] or output.splitlines()[-5:])


def _pyspark_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def pyspark_jar_artifacts() -> set[str]:
    """Artifact names (without version) of the jars PySpark ships."""
    jars = _pyspark_dir() / "jars"
    return {_artifact(p.name) for p in jars.glob("*.jar")}


def _artifact(filename: str) -> str:
    match = _VERSIONED_JAR.match(filename)
    return match.group("artifact") if match else filename


def _without_pyspark_duplicates(jars: list[Path]) -> list[Path]:
    shipped = pyspark_jar_artifacts()
    kept = [j for j in jars if _artifact(j.name) not in shipped]
    for dropped in sorted(set(jars) - set(kept)):
        log.debug("not adding %s: PySpark ships that artifact", dropped.name)
    return kept
