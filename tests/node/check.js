// Calls the Bladbase rate-limit service from Node.js with nothing but the proto file
// (@grpc/grpc-js + @grpc/proto-loader), and checks the answers against the contract
// (DESIGN §2). Callers in other languages do exactly this.
//
//   npm ci && node check.js 127.0.0.1:50051
//
// Expects a freshly started service with the built-in limits (mcp = 120 per 60 s, the
// default). Prints each response, then "N passed, M failed"; exits 1 on any mismatch.
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const target = process.argv[2] || process.env.RATELIMIT_ADDR || '127.0.0.1:50051';
const protoDir = path.join(__dirname, '..', '..', 'proto');

const definition = protoLoader.loadSync('bladbase/ratelimit/v1/ratelimit.proto', {
  includeDirs: [protoDir],
  keepCase: true, // field names as in the proto: limit_name, reset_after...
  longs: String, // int64 window as a string (it does not fit a JS number exactly)
  enums: String, // Source as its name, e.g. "SOURCE_STORE"
  defaults: true, // proto3 zero values present (allowed: false, remaining: 0)
});
const { RateLimiter } = grpc.loadPackageDefinition(definition).bladbase.ratelimit.v1;
const client = new RateLimiter(target, grpc.credentials.createInsecure());

// Every call carries a deadline, as the Rust client's does: a rate check must never hold
// the caller up.
const call = (method, request) =>
  new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + 1500 }, (err, response) =>
      err ? reject(err) : resolve(response),
    );
  });

let passed = 0;
let failed = 0;
function expect(what, actual, wanted) {
  if (actual === wanted) {
    passed += 1;
  } else {
    failed += 1;
    console.error(`FAIL ${what}: got ${JSON.stringify(actual)}, want ${JSON.stringify(wanted)}`);
  }
}

async function main() {
  const key = `node-example-${process.pid}-${Date.now()}`;

  const first = await call('Check', { key, limit: '', cost: 1 });
  console.log('Check ->', JSON.stringify(first));
  expect('allowed', first.allowed, true);
  expect('limit', first.limit, 120);
  expect('remaining', first.remaining, 119);
  expect('shared', first.shared, true);
  expect('source', first.source, 'SOURCE_STORE');
  expect('limit_name', first.limit_name, 'mcp');
  const reset = Number(first.reset_after && first.reset_after.seconds);
  expect('0 < reset_after <= 60', reset > 0 && reset <= 60, true);
  expect('no retry_after when allowed', first.retry_after, null);
  expect('window = floor(now / 60 s)', Math.abs(Number(first.window) - Math.floor(Date.now() / 60000)) <= 1, true);

  const second = await call('Check', { key, limit: 'mcp', cost: 5 });
  console.log('Check cost 5 ->', JSON.stringify(second));
  // A window may end between two calls; the new one starts from zero.
  expect('remaining after cost 5', second.remaining, second.window === first.window ? 114 : 115);

  const peek = await call('Peek', { key, limit: '' });
  console.log('Peek ->', JSON.stringify(peek));
  expect('peek counts nothing', peek.remaining, peek.window === second.window ? second.remaining : 120);

  const limits = await call('ListLimits', {});
  console.log('ListLimits ->', JSON.stringify(limits));
  expect('one limit', limits.limits.length, 1);
  const mcp = limits.limits[0] || {};
  expect('default limit', mcp.is_default, true);
  expect('its window', mcp.window && mcp.window.seconds, '60');

  for (const [request, code, message] of [
    [{ key: '', limit: '', cost: 1 }, grpc.status.INVALID_ARGUMENT, 'key: must not be empty'],
    [{ key, limit: 'nope', cost: 1 }, grpc.status.NOT_FOUND, 'unknown limit "nope"; known limits: mcp'],
  ]) {
    try {
      const unexpected = await call('Check', request);
      failed += 1;
      console.error(`FAIL ${JSON.stringify(request)} was answered: ${JSON.stringify(unexpected)}`);
    } catch (err) {
      console.log(`Check ${JSON.stringify(request)} -> ${grpc.status[err.code]}: ${err.details}`);
      expect(`status of ${JSON.stringify(request)}`, err.code, code);
      expect(`message of ${JSON.stringify(request)}`, err.details, message);
    }
  }
}

main()
  .catch((err) => {
    failed += 1;
    console.error(`FAIL cannot call ${target}: ${err.message}`);
  })
  .finally(() => {
    client.close();
    console.log(`${passed} passed, ${failed} failed`);
    process.exitCode = failed === 0 ? 0 : 1;
  });
