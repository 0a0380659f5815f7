#!/usr/bin/env python3
"""Fidelity check: drive rtdb-emulator with the official Firebase Admin Python SDK.

The SDK's REST code has integration tests against production RTDB, so everything it does
here must work against the emulator exactly as it does against the real service. Any
divergence fails loudly with a message and a non-zero exit status.

Run through tests/fidelity/run.sh, which starts the emulator and sets
FIREBASE_DATABASE_EMULATOR_HOST. In emulator mode the SDK needs no credentials: it sends
`Authorization: Bearer owner` and `?ns=<first label of databaseURL>` on every request.
"""

import json
import os
import sys
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import firebase_admin
from firebase_admin import db, exceptions

DB_URL = 'https://fidelity-test-default-rtdb.firebaseio.com'
NS = 'fidelity-test-default-rtdb'
HOST = os.environ.get('FIREBASE_DATABASE_EMULATOR_HOST', '')

RULES = {
    'rules': {
        'public': {'.read': True, '.write': 'auth != null'},
        'users': {'$uid': {'.read': 'auth != null', '.write': 'auth != null'}},
        'rateLimits': {'.read': False, '.write': False},
    }
}

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def expect(actual, expected, what):
    if actual != expected:
        raise AssertionError(f'{what}: expected {expected!r}, got {actual!r}')


def expect_raises(exc_type, fn, what, message=None):
    try:
        fn()
    except exc_type as e:
        if message is not None and str(e) != message:
            raise AssertionError(f'{what}: expected message {message!r}, got {str(e)!r}') from e
        return e
    except Exception as e:  # pylint: disable=broad-except
        raise AssertionError(f'{what}: expected {exc_type.__name__}, got {type(e).__name__}: {e}') from e
    raise AssertionError(f'{what}: expected {exc_type.__name__}, nothing was raised')


def http(method, path, body=None, token='owner', query=''):
    """A plain HTTP request (no SDK): returns (status, headers, body text)."""
    url = f'http://{HOST}{path}?ns={NS}{query}'
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        req.add_header('Authorization', f'Bearer {token}')
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def owner_ref(path):
    return db.reference(path)


@check
def missing_path_reads_as_none():
    expect(owner_ref('fidelity/missing/deep').get(), None, 'get() of a missing path')
    expect(owner_ref('fidelity/missing').get(etag=True), (None, 'null_etag'),
           'get(etag=True) of a missing path')


@check
def set_get_round_trip_keeps_integers():
    ref = owner_ref('fidelity/roundtrip')
    value = {'count': 10, 'name': 'x', 'nested': {'list': [1, 2, 3], 'flag': True}, 'f': 1.5}
    ref.set(value)
    expect(ref.get(), value, 'get() after set()')
    ref.child('asfloat').set(10.0)
    got = ref.child('asfloat').get()
    expect((got, type(got).__name__), (10, 'int'), 'an integral float reads back as an integer')
    ref.child('empty').set({})
    expect(ref.child('empty').get(), None, 'set({}) removes the node')


@check
def get_with_etag():
    ref = owner_ref('fidelity/etag')
    ref.set({'a': 1})
    value, etag = ref.get(etag=True)
    expect(value, {'a': 1}, 'value from get(etag=True)')
    if not isinstance(etag, str) or len(etag) != 28:
        raise AssertionError(f'etag should be 28 base64 characters, got {etag!r}')
    expect(ref.get(etag=True)[1], etag, 'the etag is stable')
    owner_ref('fidelity/etag_copy').set({'a': 1})
    expect(owner_ref('fidelity/etag_copy').get(etag=True)[1], etag, 'equal content, equal etag')


@check
def set_if_unchanged_stale_and_fresh():
    ref = owner_ref('fidelity/conditional')
    ref.set({'count': 1})
    _, stale = ref.get(etag=True)
    ref.set({'count': 2})
    current_value, current_etag = ref.get(etag=True)
    result = ref.set_if_unchanged(stale, {'count': 99})
    expect(result, (False, current_value, current_etag), 'set_if_unchanged with a stale etag')
    expect(ref.get(), {'count': 2}, 'a failed set_if_unchanged writes nothing')
    ok, value, _ = ref.set_if_unchanged(current_etag, {'count': 3})
    expect((ok, value), (True, {'count': 3}), 'set_if_unchanged with the fresh etag')
    expect(ref.get(), {'count': 3}, 'value after a successful set_if_unchanged')
    # null_etag works as the etag of an empty location, and only while it is empty.
    empty = owner_ref('fidelity/conditional_new')
    expect(empty.set_if_unchanged('null_etag', 5)[0], True, 'null_etag on an empty location')
    ok, value, etag = empty.set_if_unchanged('null_etag', 6)
    expect((ok, value, etag), (False, 5, empty.get(etag=True)[1]), 'null_etag once data exists')
    ok, value, etag = empty.set_if_unchanged('garbage', 6)
    expect((ok, value), (False, 5), 'a garbage etag')


@check
def get_if_changed():
    ref = owner_ref('fidelity/ifchanged')
    ref.set('v1')
    _, etag = ref.get(etag=True)
    expect(ref.get_if_changed(etag), (False, None, None), 'get_if_changed with the current etag')
    ref.set('v2')
    changed, value, new_etag = ref.get_if_changed(etag)
    expect((changed, value, new_etag), (True, 'v2', ref.get(etag=True)[1]),
           'get_if_changed with a stale etag')


@check
def concurrent_transactions_count_exactly():
    ref = owner_ref('fidelity/counter')
    threads, per_thread = 8, 25
    aborted = []

    def worker():
        done = 0
        while done < per_thread:
            try:
                ref.transaction(lambda current: (current or 0) + 1)
                done += 1
            except db.TransactionAbortedError:
                # 25 lost races in a row: nothing was written, so trying again is safe.
                aborted.append(1)

    http('POST', '/.emulator/stats/reset')
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for f in [pool.submit(worker) for _ in range(threads)]:
            f.result()
    stats = json.loads(http('GET', '/.emulator/stats')[2])
    expect(ref.get(), threads * per_thread, f'counter after {threads}x{per_thread} transactions')
    # Each committed transaction is exactly one successful conditional PUT; every other PUT
    # lost a race and got 412 (the SDK then retries from the 412 body, without a GET).
    puts, conflicts = stats['by_method'].get('PUT', 0), stats['by_status'].get('412', 0)
    expect(stats['writes'], threads * per_thread, 'successful writes during the transactions')
    expect(puts, threads * per_thread + conflicts, 'PUTs = commits + 412 conflicts')
    print(f'  {puts} conditional PUTs, {conflicts} conflicts (412), '
          f'{stats["by_method"].get("GET", 0)} GETs')
    if aborted:
        print(f'  note: {len(aborted)} transaction(s) aborted after 25 retries and were re-run')


@check
def transaction_on_structured_node():
    ref = owner_ref('fidelity/window')

    def bump(current):
        current = current or {}
        return {'w42': current.get('w42', 0) + 1}

    for expected in (1, 2, 3):
        expect(ref.transaction(bump), {'w42': expected}, 'transaction() return value')
    expect(ref.get(), {'w42': 3}, 'window node after three transactions')


@check
def push_update_delete():
    ref = owner_ref('fidelity/ops')
    child = ref.push({'m': 1})
    if not isinstance(child.key, str) or len(child.key) != 20:
        raise AssertionError(f'push() key should be a 20-character push id, got {child.key!r}')
    expect(child.get(), {'m': 1}, 'value of the pushed child')
    second = ref.push()
    expect(second.get(), '', 'push() without a value stores an empty string')
    if not second.key > child.key:
        raise AssertionError(f'push ids must increase: {child.key!r} then {second.key!r}')
    ref.child('u').set({'a': 1, 'b': {'c': 2, 'd': 3}, 'gone': True})
    ref.child('u').update({'a': 10, 'b/c': 20, 'gone': None, 'x/y': 'z'})
    expect(ref.child('u').get(), {'a': 10, 'b': {'c': 20, 'd': 3}, 'x': {'y': 'z'}},
           'update() merges named children, multi-path keys, null deletes')
    ref.child('u').delete()
    expect(ref.child('u').get(), None, 'get() after delete()')
    expect(ref.get(shallow=True), {child.key: True, second.key: True}, 'shallow get()')


@check
def invalid_data_is_invalid_argument():
    ref = owner_ref('fidelity/invalid')
    e = expect_raises(exceptions.InvalidArgumentError, lambda: ref.set({'a.b': 1}),
                      'a key containing "." in written data')
    if not str(e):
        raise AssertionError('the 400 error carries no message')
    expect(ref.get(), None, 'nothing written by an invalid set()')


@check
def rules_and_permission_denied():
    # Load rules as firebase-tools does: PUT /.settings/rules.json with the owner token.
    status, _, body = http('PUT', '/.settings/rules.json', json.dumps(RULES))
    expect(status, 200, f'owner PUT of rules (body {body})')
    status, _, body = http('PUT', '/.settings/rules.json', json.dumps(RULES), token=None)
    expect(status, 403, f'non-owner PUT of rules (body {body})')

    owner_ref('rateLimits/k').set({'w': 1})
    owner_ref('public/p').set('hello')
    anon_app = firebase_admin.initialize_app(
        options={'databaseURL': DB_URL, 'databaseAuthVariableOverride': None}, name='anon')
    user_app = firebase_admin.initialize_app(
        options={'databaseURL': DB_URL, 'databaseAuthVariableOverride': {'uid': 'u1'}},
        name='user')
    anon = lambda path: db.reference(path, app=anon_app)  # noqa: E731
    user = lambda path: db.reference(path, app=user_app)  # noqa: E731

    for what, fn in [
            ('anonymous get() of rateLimits', lambda: anon('rateLimits/k').get()),
            ('anonymous set() of rateLimits', lambda: anon('rateLimits/k').set({'w': 99})),
            ('authenticated transaction() on rateLimits',
             lambda: user('rateLimits/k').transaction(lambda c: c)),
            ('anonymous write under auth != null', lambda: anon('public/p').set('x')),
            ('anonymous read of the root', lambda: anon('').get()),
    ]:
        expect_raises(exceptions.UnauthenticatedError, fn, what, message='Permission denied')
    expect(owner_ref('rateLimits/k').get(), {'w': 1}, 'denied writes change nothing')
    expect(anon('public/p').get(), 'hello', 'anonymous read of a public path')
    user('public/p').set('by user')
    expect(owner_ref('public/p').get(), 'by user', 'authenticated write under auth != null')
    user('users/u1').update({'name': 'U', 'age': 3})
    expect(user('users/u1').get(), {'name': 'U', 'age': 3}, 'wildcard rule read/write')

    # The same denial without the SDK: no token at all.
    status, headers, body = http('GET', '/rateLimits/k.json', token=None)
    expect((status, json.loads(body)), (401, {'error': 'Permission denied'}),
           'plain GET without a token')
    expect(headers.get('Content-Type'), 'application/json; charset=utf-8', '401 content type')


def main():
    if not HOST:
        print('FIREBASE_DATABASE_EMULATOR_HOST is not set (use tests/fidelity/run.sh)',
              file=sys.stderr)
        return 2
    firebase_admin.initialize_app(options={'databaseURL': DB_URL})
    # Start from an empty database: the owner bypasses the (default deny-all) rules.
    owner_ref('/').delete()
    passed, failed = 0, 0
    for fn in CHECKS:
        try:
            fn()
        except Exception:  # pylint: disable=broad-except
            failed += 1
            print(f'FAIL {fn.__name__}')
            traceback.print_exc()
        else:
            passed += 1
            print(f'ok   {fn.__name__}')
    print(f'{passed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
