// Module resolve hook registered by pi1-host.mjs: @mariozechner/pi-<x>[/sub] -> @earendil-works/pi-<x>[/sub],
// resolved from the pi 1.x host folder.
let parentURL;

export function initialize(data) {
  parentURL = data.parentURL;
}

const ALIASED = /^@mariozechner\/(pi-[a-z-]+)(\/.*)?$/;

export async function resolve(specifier, context, nextResolve) {
  const m = ALIASED.exec(specifier);
  if (m) return nextResolve(`@earendil-works/${m[1]}${m[2] ?? ""}`, { ...context, parentURL });
  return nextResolve(specifier, context);
}
