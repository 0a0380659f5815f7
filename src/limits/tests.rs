use super::*;

fn parse(text: &str) -> Result<Limits, LimitsError> {
    Limits::from_toml("limits.toml", text)
}

#[test]
fn builtin_is_mcp_120_per_minute() {
    let l = Limits::builtin();
    let d = l.default_limit();
    assert_eq!((&*d.name, d.requests, d.window_ms), ("mcp", 120, 60_000));
    assert_eq!(d.on_store_failure, FailurePolicy::Local);
    assert_eq!(l.get("").map(|l| l.requests), Ok(120));
}

#[test]
fn parses_names_windows_policies_and_default() {
    let l = parse(
        r#"
        [[limit]]
        name = "mcp"
        requests = 120
        window = "60s"
        default = true

        [[limit]]
        name = "uploads"
        requests = 20
        window = "1h"
        on_store_failure = "allow"

        [[limit]]
        name = "signin"
        requests = 5
        window = "15m"
        on_store_failure = "deny"
        "#,
    )
    .expect("valid file");
    assert_eq!(l.names(), ["mcp", "uploads", "signin"]);
    assert_eq!(&*l.default_limit().name, "mcp");
    let up = l.get("uploads").expect("uploads");
    assert_eq!(
        (up.requests, up.window_ms, up.on_store_failure),
        (20, 3_600_000, FailurePolicy::Allow)
    );
    let si = l.get("signin").expect("signin");
    assert_eq!(
        (si.requests, si.window_ms, si.on_store_failure),
        (5, 900_000, FailurePolicy::Deny)
    );
    assert!(
        l.summary().contains("mcp=120/1m (default)"),
        "{}",
        l.summary()
    );
}

#[test]
fn policy_names_round_trip() {
    for p in [
        FailurePolicy::Local,
        FailurePolicy::Allow,
        FailurePolicy::Deny,
    ] {
        assert_eq!(FailurePolicy::from_name(p.as_str()), Some(p));
    }
    assert_eq!(FailurePolicy::from_name("maybe"), None);
}

#[test]
fn single_limit_is_the_default() {
    let l = parse("[[limit]]\nname = \"a\"\nrequests = 1\nwindow = \"1s\"\n").expect("valid");
    assert_eq!(&*l.default_limit().name, "a");
}

fn err(text: &str) -> String {
    parse(text).expect_err("must be refused").to_string()
}

#[test]
fn zero_requests_is_refused_naming_file_and_limit() {
    let e = err("[[limit]]\nname = \"mcp\"\nrequests = 0\nwindow = \"60s\"\n");
    assert_eq!(
        e,
        "limits.toml: limit \"mcp\": requests must be between 1 and 1000000000, got 0"
    );
}

#[test]
fn negative_requests_is_refused() {
    let e = err("[[limit]]\nname = \"mcp\"\nrequests = -5\nwindow = \"60s\"\n");
    assert!(
        e.contains("limit \"mcp\": requests must be between 1"),
        "{e}"
    );
}

#[test]
fn zero_and_odd_windows_are_refused() {
    let e = err("[[limit]]\nname = \"mcp\"\nrequests = 5\nwindow = \"0s\"\n");
    assert!(
        e.starts_with("limits.toml: limit \"mcp\": window must be whole seconds"),
        "{e}"
    );
    let e = err("[[limit]]\nname = \"mcp\"\nrequests = 5\nwindow = \"1500ms\"\n");
    assert!(e.contains("window must be whole seconds"), "{e}");
    let e = err("[[limit]]\nname = \"mcp\"\nrequests = 5\nwindow = \"soon\"\n");
    assert!(e.contains("window \"soon\" is not a duration"), "{e}");
}

#[test]
fn duplicate_names_are_refused() {
    let e = err(
        "[[limit]]\nname = \"a\"\nrequests = 1\nwindow = \"1s\"\ndefault = true\n\
         [[limit]]\nname = \"a\"\nrequests = 2\nwindow = \"1s\"\n",
    );
    assert_eq!(
        e,
        "limits.toml: limit \"a\": duplicate name; each limit needs its own"
    );
}

#[test]
fn missing_or_several_defaults_are_refused() {
    let two = "[[limit]]\nname = \"a\"\nrequests = 1\nwindow = \"1s\"\n\
               [[limit]]\nname = \"b\"\nrequests = 1\nwindow = \"1s\"\n";
    assert!(err(two).contains("no default limit"));
    let both = two.replace("window = \"1s\"\n", "window = \"1s\"\ndefault = true\n");
    assert!(err(&both).contains("several default limits (a, b)"));
    assert!(err("").contains("no limits defined"));
}

#[test]
fn bad_names_unknown_fields_and_bad_policies_are_refused() {
    assert!(
        err("[[limit]]\nname = \"a/b\"\nrequests = 1\nwindow = \"1s\"\n")
            .contains("limit \"a/b\": name must be")
    );
    assert!(
        err("[[limit]]\nname = \"\"\nrequests = 1\nwindow = \"1s\"\n").contains("name must be")
    );
    assert!(
        err("[[limit]]\nname = \"a\"\nrequests = 1\nwindow = \"1s\"\nburst = 3\n")
            .contains("unknown field `burst`")
    );
    assert!(
        err(
            "[[limit]]\nname = \"a\"\nrequests = 1\nwindow = \"1s\"\non_store_failure = \"maybe\"\n"
        )
        .contains("unknown variant `maybe`")
    );
    assert!(err("[[limit]]\nname = \"a\"\n").contains("missing field `requests`"));
}

#[test]
fn unknown_limit_lists_known_names() {
    let l = Limits::builtin();
    let e = l.get("uploads").expect_err("unknown");
    assert_eq!(
        e.to_string(),
        "unknown limit \"uploads\"; known limits: mcp"
    );
    // A caller's name is quoted up to the longest a configured one can be.
    let long = "é".repeat(60_000);
    let e = l.get(&long).expect_err("unknown");
    assert_eq!(e.name, long, "the error keeps the whole name");
    assert_eq!(
        e.to_string(),
        format!(
            "unknown limit {:?}… (120000 bytes); known limits: mcp",
            "é".repeat(MAX_NAME_LEN)
        )
    );
    let at_most = "x".repeat(MAX_NAME_LEN);
    assert!(
        l.get(&at_most)
            .expect_err("unknown")
            .to_string()
            .contains(&format!("{at_most:?};"))
    );
}

#[test]
fn load_names_the_file_when_missing() {
    let e = Limits::load(Path::new("/nonexistent/limits.toml")).expect_err("missing");
    assert!(
        e.to_string()
            .starts_with("/nonexistent/limits.toml: cannot read the limits file")
    );
}

#[test]
fn names_are_plain_path_segments_within_the_budget() {
    let file =
        |name: &str| format!("[[limit]]\nname = \"{name}\"\nrequests = 1\nwindow = \"1s\"\n");
    let longest = "n".repeat(MAX_NAME_LEN);
    assert!(parse(&file(&longest)).is_ok());
    assert!(parse(&file("sign-in_v2")).is_ok());
    for bad in [
        "a~b",
        "a.b",
        "a+b",
        "a%20b",
        "ключ",
        "a b",
        &"n".repeat(MAX_NAME_LEN + 1),
    ] {
        assert!(
            err(&file(bad)).contains("name must be 1 to 64 characters of A-Z a-z 0-9 _ -"),
            "{bad}"
        );
    }
}

#[test]
fn months_and_years_are_refused_as_windows_and_windows_show_in_fixed_units() {
    for window in ["1M", "1month", "2 months", "1y", "1year"] {
        let text = format!("[[limit]]\nname = \"m\"\nrequests = 1\nwindow = \"{window}\"\n");
        let e = parse(&text).expect_err(window).to_string();
        assert!(e.contains("write days"), "{window}: {e}");
    }
    let ok = parse("[[limit]]\nname = \"m\"\nrequests = 1\nwindow = \"1m 30s\"\n").expect("ok");
    assert_eq!(ok.default_limit().window(), Duration::from_secs(90));
    assert_eq!(format_window(Duration::from_secs(90)), "1m 30s");
    assert_eq!(format_window(Duration::from_secs(31 * 86_400)), "31d");
    assert_eq!(format_window(Duration::from_secs(86_400 + 7_200)), "1d 2h");
    assert_eq!(format_window(Duration::from_millis(500)), "500ms");
    assert_eq!(format_window(Duration::from_millis(1_500)), "1s 500ms");
    assert_eq!(format_window(Duration::ZERO), "0s");
    let e = parse("[[limit]]\nname = \"m\"\nrequests = 1\nwindow = \"32d\"\n")
        .expect_err("too long")
        .to_string();
    assert!(e.contains("got 32d"), "{e}");
}

#[test]
fn two_limits_of_one_name_and_no_default_is_a_duplicate_name() {
    let e = parse(
        "[[limit]]\nname = \"a\"\nrequests = 1\nwindow = \"1s\"\n[[limit]]\nname = \"a\"\nrequests = 2\nwindow = \"1s\"\n",
    )
    .expect_err("duplicate")
    .to_string();
    assert!(e.contains("duplicate name"), "{e}");
}

#[test]
fn a_single_bracket_table_is_told_to_use_double_brackets() {
    let e = parse("[limit]\nname = \"a\"\nrequests = 1\nwindow = \"1s\"\n")
        .expect_err("one table, not an array")
        .to_string();
    assert!(e.contains("[[limit]]"), "{e}");
}
