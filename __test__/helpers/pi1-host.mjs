// `node --import ./__test__/helpers/pi1-host.mjs`: run the tests against the pi 1.x host in
// .hosts/pi1 (see scripts/pi1-host.mjs). Every `@mariozechner/pi-*` import made by test code is
// resolved to the matching `@earendil-works/pi-*` package of that host, the same aliasing pi 1.x
// applies to extensions, so the test files and the harness keep their imports and talk to the
// host under test. Type-only imports are erased and never get here.
import { register } from "node:module";
import { pathToFileURL } from "node:url";

const hostDir = new URL("../../.hosts/pi1/", import.meta.url);
process.env.PI_HOST = "pi1";

register("./pi1-resolve.mjs", import.meta.url, {
  // Resolution of the rewritten names starts from the host folder, not from the repository's
  // node_modules (which hold pi 0.73).
  data: { parentURL: pathToFileURL(new URL("package.json", hostDir).pathname).href },
});
