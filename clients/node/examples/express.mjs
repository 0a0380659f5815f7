// An Express service rate limited by @bladbase/ratelimit: each API token gets the
// service's `mcp` limit (120 requests a minute by default), shared by every instance.
//
//   ratelimit serve --listen 127.0.0.1:50051 &
//   RATELIMIT_ADDRESS=127.0.0.1:50051 PORT=8080 node examples/express.mjs
//   curl -i -H 'x-api-token: alice' http://127.0.0.1:8080/
//
// With the service down it still answers, from this process's own window (shared: false).
import express from "express";
import { createRateLimiter } from "@bladbase/ratelimit";

const limiter = createRateLimiter({ address: process.env.RATELIMIT_ADDRESS ?? "127.0.0.1:50051" });

const app = express();
// 429 + headers + a JSON body when refused; the headers on every admitted response.
// A request without a token passes unlimited (refusing it is the auth layer's job).
app.use(limiter.middleware({ limit: "mcp", key: (req) => req.get("x-api-token") }));
app.get("/", (req, res) => {
  res.json({ hello: req.get("x-api-token") ?? "anonymous" });
});

const server = app.listen(Number(process.env.PORT ?? 8080), "127.0.0.1", () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
process.on("SIGTERM", () => {
  server.close();
  limiter.close();
});
