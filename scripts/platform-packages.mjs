// The per-platform npm packages in npm/<platform>/ (made by `napi create-npm-dirs`), which carry
// the prebuilt addon and are the root package's optionalDependencies.
//
//   node scripts/platform-packages.mjs sync    set every npm/*/package.json version to the root
//                                              version and write the root optionalDependencies and
//                                              their package-lock.json entries (what `napi
//                                              pre-publish` writes, plus the lock npm ci needs)
//   node scripts/platform-packages.mjs check   fail if `sync` would change anything
//   node scripts/platform-packages.mjs stage   copy this machine's build (./<binary>.<platform>.node)
//                                              into its npm/<platform>/, as `napi artifacts` does in
//                                              a release with every target built
//
// Why the lock entries are written by hand: until a platform package is on the registry, `npm
// install` records the optional dependency but no `node_modules/<name>` entry, and `npm ci` then
// refuses the lock as out of sync. With the entry, npm ci tries the registry, and a missing
// optional package is skipped. Once published, npm keeps the entries and adds their integrity.
import { copyFileSync, existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { root } from "./prepare.mjs";

const readJson = (path) => JSON.parse(readFileSync(path, "utf8"));
const writeJson = (path, value) => writeFileSync(path, `${JSON.stringify(value, null, 2)}\n`);

/** { dir, name, version, platform, manifest } of each npm/<platform>/ package. */
export function platformPackages() {
  const npmDir = join(root, "npm");
  return readdirSync(npmDir, { withFileTypes: true })
    .filter((e) => e.isDirectory() && existsSync(join(npmDir, e.name, "package.json")))
    .map((e) => {
      const dir = join(npmDir, e.name);
      const manifest = readJson(join(dir, "package.json"));
      return { dir, platform: e.name, name: manifest.name, version: manifest.version, manifest };
    })
    .sort((a, b) => a.name.localeCompare(b.name));
}

/** The platform directory name of this machine, as napi names it (linux-x64-gnu, ...). */
export function hostPlatform() {
  const arch = { x64: "x64", arm64: "arm64" }[process.arch];
  if (process.platform !== "linux" || !arch) throw new Error(`no platform package for ${process.platform}-${process.arch}`);
  return `linux-${arch}-gnu`;
}

/** Brings npm/*, package.json and package-lock.json in line; returns what changed (nothing in check mode). */
export function sync({ write = true } = {}) {
  const changes = [];
  const rootPkgPath = join(root, "package.json");
  const lockPath = join(root, "package-lock.json");
  const rootPkg = readJson(rootPkgPath);
  const lock = readJson(lockPath);
  const version = rootPkg.version;
  const packages = platformPackages();

  for (const p of packages) {
    if (p.version !== version) {
      changes.push(`${p.platform}/package.json: version ${p.version} -> ${version}`);
      p.manifest.version = version;
      if (write) writeJson(join(p.dir, "package.json"), p.manifest);
    }
  }
  const wanted = Object.fromEntries(packages.map((p) => [p.name, version]));
  if (JSON.stringify(rootPkg.optionalDependencies ?? {}) !== JSON.stringify(wanted)) {
    changes.push(`package.json: optionalDependencies -> ${JSON.stringify(wanted)}`);
    rootPkg.optionalDependencies = wanted;
    if (write) writeJson(rootPkgPath, rootPkg);
  }

  // Key orders as npm writes them, so that a later `npm install` leaves the lock as it is.
  const lockRoot = lock.packages[""];
  let lockChanged = false;
  if (JSON.stringify(lockRoot.optionalDependencies ?? {}) !== JSON.stringify(wanted)) {
    const { optionalDependencies: _, peerDependencies, ...rest } = lockRoot;
    lock.packages[""] = { ...rest, optionalDependencies: wanted, ...(peerDependencies && { peerDependencies }) };
    lockChanged = true;
  }
  for (const p of packages) {
    const key = `node_modules/${p.name}`;
    const entry = lock.packages[key];
    if (entry?.version === version && entry.optional) continue;
    const m = p.manifest;
    lock.packages[key] = {
      version,
      ...(m.cpu && { cpu: m.cpu }),
      ...(m.libc && { libc: m.libc }),
      ...(m.license && { license: m.license }),
      optional: true,
      ...(m.os && { os: m.os }),
      ...(m.engines && { engines: m.engines }),
    };
    lockChanged = true;
  }
  if (lockChanged) {
    changes.push("package-lock.json: optional platform packages");
    if (write) {
      lock.packages = Object.fromEntries(
        Object.entries(lock.packages).sort(([a], [b]) => (a === "" ? -1 : b === "" ? 1 : a.localeCompare(b))),
      );
      writeJson(lockPath, lock);
    }
  }
  return changes;
}

/** Copies this machine's build into npm/<platform>/; returns that package directory. */
export function stage() {
  const platform = hostPlatform();
  const pkg = platformPackages().find((p) => p.platform === platform);
  if (!pkg) throw new Error(`npm/${platform}/ is missing: run \`npx napi create-npm-dirs\``);
  const file = pkg.manifest.main;
  const built = join(root, file);
  if (!existsSync(built)) throw new Error(`${file} is not built: run \`npm run build\``);
  copyFileSync(built, join(pkg.dir, file));
  return pkg.dir;
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const command = process.argv[2];
  if (command === "sync") {
    const changes = sync();
    console.log(changes.length ? changes.join("\n") : "platform packages in sync");
  } else if (command === "check") {
    const changes = sync({ write: false });
    if (changes.length) {
      console.error(`platform packages out of sync (run \`node scripts/platform-packages.mjs sync\`):\n${changes.join("\n")}`);
      process.exit(1);
    }
    console.log("platform packages in sync");
  } else if (command === "stage") {
    console.log(`staged ${stage()}`);
  } else {
    console.error("usage: node scripts/platform-packages.mjs sync|check|stage");
    process.exit(2);
  }
}
