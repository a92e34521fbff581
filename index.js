// The entry pi loads (package.json `pi.extensions`). It sits at the package root because pi
// names an extension after the folder of its index file: from js/index.ts its header listed
// this package as `js`; from here it is `pi-python-sandbox` (or a checkout's folder name).
// JavaScript, not index.ts: beside napi-rs's index.d.ts, TypeScript would take an index.ts
// for that declaration's source.
export { default } from "./js/index.ts";
