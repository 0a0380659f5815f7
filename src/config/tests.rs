use super::*;

#[test]
fn durations_accept_fractions_and_units() {
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1_500)));
    assert_eq!(parse_duration("800ms"), Ok(Duration::from_millis(800)));
    assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
    assert!(parse_duration("0s").is_err());
    assert!(parse_duration("-1.5s").is_err());
    assert!(parse_duration("soon").is_err());
}

#[test]
fn default_listen_address_is_all_interfaces_on_port() {
    let cli = Cli::try_parse_from(["ratelimit", "serve", "--port", "6000"]).expect("parses");
    let Command::Serve(args) = cli.command else {
        panic!("serve expected");
    };
    assert_eq!(
        args.listen_addr().ok().map(|a| a.to_string()).as_deref(),
        Some("0.0.0.0:6000")
    );
    assert_eq!(args.store_timeout, Duration::from_millis(1_500));
    assert_eq!(
        args.memory_limit,
        crate::memory_budget::DEFAULT_MEMORY_LIMIT
    );
    let e = Cli::try_parse_from(["ratelimit", "serve", "--memory-limit", "lots"])
        .expect_err("refused")
        .to_string();
    assert!(e.contains("\"lots\" is not a size like 256MiB"), "{e}");
    assert_eq!(args.deny_trust, Duration::from_secs(1));
    assert_eq!(args.workers, 1, "one thread decides unless told otherwise");
    let e = Cli::try_parse_from(["ratelimit", "serve", "--workers", "two"])
        .expect_err("refused")
        .to_string();
    assert!(e.contains("--workers"), "{e}");
}

#[test]
fn workers_choose_the_runtime() {
    use tokio::runtime::RuntimeFlavor;
    let flavor = |n| crate::server::runtime(n).map(|rt| rt.handle().runtime_flavor());
    assert_eq!(flavor(1).ok(), Some(RuntimeFlavor::CurrentThread));
    assert_eq!(flavor(2).ok(), Some(RuntimeFlavor::MultiThread));
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let per_core = if cores > 1 {
        RuntimeFlavor::MultiThread
    } else {
        RuntimeFlavor::CurrentThread
    };
    assert_eq!(flavor(0).ok(), Some(per_core));
}

#[test]
fn a_worker_count_the_os_may_refuse_is_a_usage_error() {
    let serve = |w: &str| Cli::try_parse_from(["ratelimit", "serve", "--workers", w]);
    assert!(serve("1024").is_ok());
    let e = serve("100000")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("--workers") && e.contains("1024"), "{e}");
}

#[test]
fn a_log_filter_that_would_silence_the_service_is_refused() {
    for ok in [
        "info",
        "WARN",
        "ratelimit=debug,info",
        "tonic=warn, debug",
        "off",
    ] {
        assert_eq!(parse_log_filter(ok).as_deref(), Ok(ok.trim()), "{ok}");
    }
    for (bad, says) in [
        ("", "empty"),
        ("  ", "empty"),
        ("debugg", "not a level"),
        ("info,ratelimit", "not a level"),
        ("ratelimit=loud", "not a log filter"),
    ] {
        let e = parse_log_filter(bad).expect_err(bad);
        assert!(e.contains(says), "{bad:?}: {e}");
    }
}
