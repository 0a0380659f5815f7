// Types of the ESM entry point (index.mjs): the same as the CommonJS build's.
export * from "./index.js";
import * as all from "./index.js";
export default all;
