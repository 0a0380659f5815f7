//! The memory store's behaviour: the admission rule, one counter per key across windows,
//! the byte budget and the expiry that bounds it in time.

use super::*;
use crate::cache_key::KeyRef;

fn store() -> MemoryStore {
    MemoryStore::new()
}

#[test]
fn admits_up_to_the_limit_then_denies() {
    let s = store();
    let l = Limit::new("t", 3, Duration::from_secs(60));
    let got: Vec<bool> = (0..5)
        .map(|_| s.admit_now(&l, "k", 1, &[1]).outcomes[0].allowed)
        .collect();
    assert_eq!(got, [true, true, true, false, false]);
    assert_eq!(s.peek_now(&l, "k", 1).count, 3);
    assert_eq!(
        s.peek_now(&l, "k", 2).count,
        0,
        "a new window starts at zero"
    );
}

#[test]
fn keys_limits_and_windows_are_independent() {
    let s = store();
    let a = Limit::new("a", 1, Duration::from_secs(60));
    let b = Limit::new("b", 1, Duration::from_secs(60));
    assert!(s.admit_now(&a, "k", 1, &[1]).outcomes[0].allowed);
    assert!(s.admit_now(&b, "k", 1, &[1]).outcomes[0].allowed);
    assert!(s.admit_now(&a, "k2", 1, &[1]).outcomes[0].allowed);
    assert!(s.admit_now(&a, "k", 2, &[1]).outcomes[0].allowed);
    assert!(!s.admit_now(&a, "k", 1, &[1]).outcomes[0].allowed);
}

#[test]
fn reset_clears_the_window() {
    let s = store();
    let l = Limit::new("t", 1, Duration::from_secs(60));
    assert!(s.admit_now(&l, "k", 1, &[1]).outcomes[0].allowed);
    s.reset_now(&l, "k");
    assert_eq!(s.peek_now(&l, "k", 1).count, 0);
    assert!(s.admit_now(&l, "k", 1, &[1]).outcomes[0].allowed);
}

#[test]
fn release_gives_back_at_most_what_was_counted_in_that_window() {
    let s = store();
    let l = Limit::new("t", 10, Duration::from_secs(60));
    s.admit_now(&l, "k", 1, &[4]);
    assert!(
        !s.release_now(&l, "k", 2, 1, 0),
        "another window: nothing to give back"
    );
    assert!(s.release_now(&l, "k", 1, 3, 0));
    assert_eq!(s.peek_now(&l, "k", 1).count, 1);
    assert!(s.release_now(&l, "k", 1, 9, 0));
    assert_eq!(s.peek_now(&l, "k", 1).count, 0, "never below zero");
    assert!(!s.release_now(&l, "k", 1, 1, 0));
    s.admit_now(&l, "k", 1, &[8]);
    assert!(s.release_now(&l, "k", 1, 6, 5), "3 of 6: never below keep");
    assert_eq!(s.peek_now(&l, "k", 1).count, 5);
    assert!(!s.release_now(&l, "k", 1, 1, 5));
}

#[test]
fn concurrent_threads_admit_exactly_the_limit() {
    let s = store();
    let l = Limit::new("t", 1_000, Duration::from_secs(60));
    let admitted = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    (0..500)
                        .filter(|_| s.admit_now(&l, "hot", 1, &[1]).outcomes[0].allowed)
                        .count()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(0))
            .sum::<usize>()
    });
    assert_eq!(admitted, 1_000);
    assert_eq!(s.peek_now(&l, "hot", 1).count, 1_000);
}

#[test]
fn one_cost_at_once_counts_on_the_batch_counter_by_the_same_rule() {
    let s = store();
    let l = Limit::new("t", 5, Duration::from_secs(60));
    assert_eq!(
        s.admit_one_now(&l, "k", 1, 2),
        (
            1,
            Outcome {
                allowed: true,
                count: 2
            }
        )
    );
    assert_eq!(s.admit_now(&l, "k", 1, &[2]).outcomes[0].count, 4);
    let (_, denied) = s.admit_one_now(&l, "k", 1, 2);
    assert!(!denied.allowed);
    assert_eq!(denied.count, 4, "a denied cost adds nothing");
    assert!(
        s.admit_one_now(&l, "k", 1, 1).1.allowed,
        "a smaller cost still fits"
    );
    assert_eq!(s.peek_now(&l, "k", 1).count, 5);
    // Borrowed and owned keys meet on one entry for every key shape, so a lookup
    // never misses a slot and starts a second counter.
    for key in ["", "k2", "ü~b%2F", &"x".repeat(512)] {
        assert!(s.admit_one_now(&l, key, 1, 5).1.allowed);
        assert!(!s.admit_one_now(&l, key, 1, 1).1.allowed, "{key:?}");
    }
    assert_eq!(s.entries(), 5);
    assert_eq!(
        CounterStore::admit_at_once(&s, &l, "k", 1, 1),
        Some((
            1,
            Outcome {
                allowed: false,
                count: 5
            }
        ))
    );
}

#[test]
fn the_byte_budget_bounds_the_entries_keys_included() {
    let s = MemoryStore::with_budget(1 << 20, "test");
    let l = Limit::new("t", 5, Duration::from_secs(60));
    for i in 0..20_000 {
        s.admit_now(&l, &format!("{i:0>500}"), 1, &[1]);
    }
    // A 500-byte key's entry weighs over 900 bytes: at most 1,100 fit in 1 MiB.
    let held = s.entries();
    assert!((100..=1_100).contains(&held), "{held}");
    assert!(s.slots.weighted_size() <= 1 << 20);
}

#[test]
fn a_new_entry_lives_a_whole_window_plus_grace_wherever_in_its_window_it_is_made() {
    // Expiry itself runs on moka's real clock (it cannot be mocked), so this checks
    // the deadline each entry is created with rather than sleeping past it. Made 1 ms
    // before its window ends, it must still outlive the next window: a check that waited
    // on its creation may count there, and that check does not extend it.
    let s = MemoryStore::new();
    let l = Limit::new("t", 5, Duration::from_secs(60));
    s.admit_now(&l, "k", 1, &[1]);
    let slot = s
        .slots
        .get(KeyRef::of(&l, "k").dyn_ref())
        .map(|s| s.first_life());
    // The first slot created gets no spread.
    assert_eq!(slot, Some(Duration::from_secs(60) + GRACE));
    assert_eq!(s.entries(), 1);
}

#[test]
fn expiry_is_spread_evenly_over_half_a_window_at_most_the_cap() {
    // 1,000 slots of a 60 s window: their extra lives fill [0 s, 30 s) with about
    // 100 in each 3 s tenth, so no maintenance run meets them all at once.
    let mut tenths = [0u32; 10];
    for n in 0..1_000 {
        let d = expiry_spread(n, 60_000);
        assert!(d < Duration::from_secs(30), "{d:?}");
        tenths[(d.as_millis() / 3_000) as usize] += 1;
    }
    assert!(
        tenths.iter().all(|&c| (95..=105).contains(&c)),
        "{tenths:?}"
    );
    // Short windows spread over half of themselves; long ones over the cap.
    assert!((0..100).all(|n| expiry_spread(n, 1_000) < Duration::from_millis(500)));
    assert!((0..100).all(|n| expiry_spread(n, 3_600_000) < SPREAD_CAP));
    assert_eq!(expiry_spread(7, 1), Duration::ZERO);
    // Slots of one store take turns, clones included.
    let s = store();
    let c = s.clone();
    let l = Limit::new("t", 5, Duration::from_secs(60));
    s.admit_now(&l, "a", 1, &[1]);
    c.admit_now(&l, "b", 1, &[1]);
    let ttl = |k: &str| {
        s.slots
            .get(KeyRef::of(&l, k).dyn_ref())
            .map(|s| s.first_life())
    };
    assert_ne!(ttl("a"), ttl("b"));
}

#[test]
fn a_key_keeps_one_counter_from_window_to_window() {
    let s = store();
    let l = Limit::new("t", 2, Duration::from_secs(60));
    for w in 1..=50 {
        let a = s.admit_now(&l, "k", w, &[1, 1, 1]);
        let allowed: Vec<bool> = a.outcomes.iter().map(|o| o.allowed).collect();
        assert_eq!(
            (a.window, allowed),
            (w, vec![true, true, false]),
            "window {w}"
        );
    }
    // Fifty windows, one entry: a window's start inserts nothing, its end removes nothing.
    assert_eq!(s.entries(), 1);
}

#[test]
fn a_check_late_for_its_window_counts_in_the_newer_one_by_the_shared_rule() {
    let s = store();
    let l = Limit::new("t", 3, Duration::from_secs(60));
    s.admit_now(&l, "k", 1, &[3]);
    assert_eq!(
        s.admit_one_now(&l, "k", 2, 1),
        (
            2,
            Outcome {
                allowed: true,
                count: 1
            }
        )
    );
    // Computed just before the boundary, arriving after it: window 2's count, not a
    // second life of window 1's.
    let late = s.admit_now(&l, "k", 1, &[1]);
    assert_eq!((late.window, late.outcomes[0].count), (2, 2));
    assert_eq!(
        s.peek_now(&l, "k", 1),
        WindowCount {
            window: 2,
            count: 2
        }
    );
    assert!(!s.release_now(&l, "k", 1, 1, 0), "window 1's hits are gone");
    assert!(s.release_now(&l, "k", 2, 1, 0));
    assert_eq!(s.peek_now(&l, "k", 2).count, 1);
}

#[test]
fn a_limit_whose_window_length_changes_starts_new_counters() {
    let s = store();
    let minute = Limit::new("t", 1, Duration::from_secs(60));
    let hour = Limit::new("t", 1, Duration::from_secs(3_600));
    // Window numbers of two lengths are not comparable (29,935,545 minutes is not a
    // later window than 498,925 hours), so they must never meet on one counter.
    assert!(s.admit_now(&minute, "k", 29_935_545, &[1]).outcomes[0].allowed);
    assert!(s.admit_now(&hour, "k", 498_925, &[1]).outcomes[0].allowed);
    assert!(!s.admit_now(&hour, "k", 498_925, &[1]).outcomes[0].allowed);
    assert_eq!(s.entries(), 2);
}

#[test]
fn reset_forgets_the_key_whatever_window_it_is_in() {
    let s = store();
    let l = Limit::new("t", 1, Duration::from_secs(60));
    s.admit_now(&l, "k", 2, &[1]);
    s.reset_now(&l, "k");
    assert_eq!(s.peek_now(&l, "k", 2).count, 0);
    assert!(s.admit_now(&l, "k", 2, &[1]).outcomes[0].allowed);
}

#[test]
fn a_read_keeps_the_slot_past_any_window_it_can_count_in_and_reschedules_rarely() {
    let l = Limit::new("t", 5, Duration::from_secs(60));
    let s = store();
    s.admit_now(&l, "k", 1, &[1]);
    let Some(slot) = s.slots.get(KeyRef::of(&l, "k").dyn_ref()) else {
        panic!("the slot was just created");
    };
    let minute = Duration::from_secs(60);
    // Enough left to outlive any window a read can be counting in: unchanged, so moka
    // does no work for the read.
    for left in [
        minute + GRACE,
        minute + GRACE + Duration::from_millis(1),
        3 * minute,
    ] {
        assert_eq!(slot.life_after_read(Some(left)), Some(left));
    }
    // Less: extended past a whole window plus grace, with room before the next extension.
    for left in [
        None,
        Some(Duration::ZERO),
        Some(minute + GRACE - Duration::from_millis(1)),
    ] {
        let Some(life) = slot.life_after_read(left) else {
            panic!("a slot always expires");
        };
        assert!(life >= minute + GRACE + GRACE, "{left:?} -> {life:?}");
        assert!(
            life < minute + GRACE + GRACE + SPREAD_CAP,
            "{left:?} -> {life:?}"
        );
    }
}

#[test]
fn a_check_of_a_known_key_allocates_nothing() {
    let s = store();
    let l = Limit::new("t", 100, Duration::from_secs(60));
    s.admit_one_now(&l, "k", 1, 1);
    s.entries();
    let (n, (_, admitted)) = crate::alloc_count::allocations(|| s.admit_one_now(&l, "k", 1, 1));
    assert!(admitted.allowed);
    assert_eq!(n, 0, "admit_one_now");
    let (n, _) = crate::alloc_count::allocations(|| s.admit_now(&l, "k", 1, &[1]));
    assert!(n <= 1, "admit_now: at most its batch's outcomes, {n}");
    let (n, seen) = crate::alloc_count::allocations(|| s.peek_now(&l, "k", 1));
    assert_eq!((n, seen.count), (0, 3), "peek_now");
    let (n, released) = crate::alloc_count::allocations(|| s.release_now(&l, "k", 1, 1, 0));
    assert_eq!((n, released), (0, true), "release_now");
}
