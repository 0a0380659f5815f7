/**
 * A size-capped least-recently-used map, the memory bound of the local window and the
 * deny-until cache: a flood of unique keys evicts the oldest, never grows the process.
 * A JavaScript `Map` iterates in insertion order, so re-inserting on use keeps the
 * least recently used entry first; that is the whole algorithm, hence no dependency.
 */
export class Lru<V> {
  private readonly entries = new Map<string, V>();
  private evictedCount = 0;

  constructor(readonly capacity: number) {}

  /** The value for `key`, marking it most recently used. */
  get(key: string): V | undefined {
    const value = this.entries.get(key);
    if (value !== undefined) {
      this.entries.delete(key);
      this.entries.set(key, value);
    }
    return value;
  }

  /** Stores `value` as most recently used, evicting the least recently used past the cap. */
  set(key: string, value: V): void {
    this.entries.delete(key);
    this.entries.set(key, value);
    while (this.entries.size > this.capacity) {
      const oldest = this.entries.keys().next();
      if (oldest.done === true) break;
      this.entries.delete(oldest.value);
      this.evictedCount += 1;
    }
  }

  delete(key: string): void {
    this.entries.delete(key);
  }

  get size(): number {
    return this.entries.size;
  }

  /** Entries evicted by the cap so far. */
  get evicted(): number {
    return this.evictedCount;
  }
}
