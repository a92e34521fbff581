/**
 * The unfiltered baseline of the escape catalogue: the same Python probe run in plain bubblewrap
 * with the sandbox's namespaces but WITHOUT its seccomp filter and rlimits, so that a probe can
 * tell "blocked by the filter" from "ran and failed". Its mounts are those the sandbox had before
 * it sized them: an unsized `--tmpfs /tmp`, and `--dev /dev`, whose /dev/shm is a folder of that
 * unsized, writable tmpfs.
 */
import { execFile } from "node:child_process";

export interface UnfilteredOptions {
  /** Bind this directory read-only at /workspace, as the sandbox does in read-only mode. */
  project?: string;
  /** Bind `project` read-write instead, as the sandbox does in the writable modes. */
  writable?: boolean;
  /**
   * Run as uid 0 with every capability of the new user namespace (the default), so that the
   * kernel's own namespace-capability checks pass and only the filter is missing. `false`: no
   * capability, as inside the sandbox, for probes whose baseline must differ from the sandbox in
   * the filter alone.
   */
  capabilities?: boolean;
}

/** Run `code`; resolves with its stdout, rejects when bubblewrap or Python fails. */
export function unfiltered(code: string, { project, writable = false, capabilities = true }: UnfilteredOptions = {}): Promise<string> {
  const argv = [
    "--unshare-user", ...(capabilities ? ["--uid", "0", "--cap-add", "ALL"] : []),
    "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent", "--new-session",
    "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
    "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
    ...(project ? [writable ? "--bind" : "--ro-bind", project, "/workspace"] : []),
    "--", "/usr/bin/python3", "-I", "-S", "-c", code,
  ];
  return new Promise((resolve, reject) => {
    // Long enough for the slowest probe (filling 300 MiB of /tmp); it only bounds a hung baseline.
    execFile("bwrap", argv, { timeout: 60_000, encoding: "utf8" }, (err, stdout, stderr) => {
      if (err) reject(new Error(`unfiltered baseline failed: ${err.message}\n${stderr}`));
      else resolve(stdout);
    });
  });
}
