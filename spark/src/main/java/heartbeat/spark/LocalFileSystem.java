/*
 * Hadoop's local file system for a local Spark, without a child process per file.
 *
 * Without Hadoop's native library (PySpark ships none), Hadoop's RawLocalFileSystem sets a new
 * file's or folder's permission by running `chmod`, and reads a file's status for a rename by
 * running `readlink`. Every Delta commit writes a log file and a checksum file through renames,
 * and every data file is created with a permission: measured on a busy tick of 100 sensors, about
 * 250 child processes of the Spark JVM, a few milliseconds each, on the tick's path.
 *
 * This file system does the same two things through java.nio instead: the permission given (the
 * one `chmod` would set) and the status Hadoop itself returns for anything that is not a symbolic
 * link (a link keeps Hadoop's own way). Everything else is RawLocalFileSystem's: no checksum side
 * files, as `fs.file.impl = RawLocalFileSystem` gives. `Context` is the same file system for
 * Hadoop's FileContext API, which Delta's log store commits through.
 *
 * Heartbeat compiles this file once with the JDK's javac (lakehouse/spark_jars.py) and puts it on
 * the Spark driver's class path (lakehouse/spark_local.py, file_system_confs).
 */
package heartbeat.spark;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class LocalFileSystem extends RawLocalFileSystem {

  /** The POSIX permission of each bit of a mode, lowest bit first (others' execute) to owner's read. */
  private static final PosixFilePermission[] MODE_BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
  };

  /** The rwx bits of {@code mode} as java.nio permissions (sticky and set-id bits are not file permissions here). */
  static Set<PosixFilePermission> posixPermissions(short mode) {
    Set<PosixFilePermission> permissions = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < MODE_BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        permissions.add(MODE_BITS[bit]);
      }
    }
    return permissions;
  }

  @Override
  public void setPermission(Path path, FsPermission permission) throws IOException {
    try {
      Files.setPosixFilePermissions(pathToFile(path).toPath(), posixPermissions(permission.toShort()));
    } catch (UnsupportedOperationException notPosix) {
      super.setPermission(path, permission);
    }
  }

  @Override
  public FileStatus getFileLinkStatus(Path path) throws IOException {
    if (Files.isSymbolicLink(pathToFile(path).toPath())) {
      return super.getFileLinkStatus(path);
    }
    return getFileStatus(path);
  }

  /** This file system behind Hadoop's FileContext ({@code fs.AbstractFileSystem.file.impl}), as Hadoop's RawLocalFs. */
  public static class Context extends DelegateToFileSystem {
    public Context(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(uri, new LocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1;
    }

    @Override
    public boolean isValidName(String src) {
      return true;
    }
  }
}
