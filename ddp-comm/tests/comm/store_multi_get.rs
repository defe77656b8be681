//! `Store::multi_get`: many keys in one round trip, never waiting, in the order asked, inside
//! the client's namespace, and a clear error (on a connection that stays usable) when the
//! request or the reply would not fit in a frame; a `set` too large is refused the same way.

use ddp_comm::{CommError, Store, StoreConfig, StoreServer};
use std::time::{Duration, Instant};

fn serve(config: StoreConfig) -> (StoreServer, String) {
    let s = StoreServer::bind("127.0.0.1:0", config).expect("bind a store");
    let addr = s.local_addr().to_string();
    (s, addr)
}

fn connect(addr: &str, config: StoreConfig) -> Store {
    Store::connect(addr, config.with_timeout(Duration::from_secs(5))).expect("connect")
}

/// The message of a store protocol error, which must be one.
fn protocol_reason(e: CommError) -> String {
    match e {
        CommError::StoreProtocol { op, ref reason } => {
            assert_eq!(op, "multi_get", "{e}");
            reason.clone()
        }
        other => panic!("expected a store protocol error, got {other:?}"),
    }
}

#[test]
fn multi_get_returns_set_unset_and_empty_values_in_order_without_waiting() {
    let (_s, addr) = serve(StoreConfig::new());
    // A long store timeout, so "did not wait for the missing key" and "a slow machine" are far
    // apart.
    let st = Store::connect(
        &addr,
        StoreConfig::new().with_timeout(Duration::from_secs(60)),
    )
    .expect("connect");
    st.set("a", b"1").expect("set");
    st.set("empty", b"").expect("set");
    let start = Instant::now();
    let got = st
        .multi_get(&["a", "missing", "empty", "a"])
        .expect("multi_get");
    // A `get` of "missing" would wait the store's 60 s timeout.
    assert!(start.elapsed() < Duration::from_secs(20), "it waited");
    assert_eq!(
        got,
        vec![
            Some(b"1".to_vec()),
            None,
            Some(Vec::new()),
            Some(b"1".to_vec())
        ]
    );
    assert_eq!(
        st.multi_get(&[]).expect("no keys"),
        Vec::<Option<Vec<u8>>>::new()
    );
    assert_eq!(st.multi_get(&["missing"]).expect("one key"), vec![None]);
    // It reads, never writes: the absent key is still absent.
    assert!(!st.check(&["missing"]).expect("check"));
}

#[test]
fn multi_get_reads_inside_the_clients_namespace() {
    let (_s, addr) = serve(StoreConfig::new());
    let root = connect(&addr, StoreConfig::new());
    let job = root.with_prefix("job1/");
    job.set("k", b"mine").expect("set");
    root.set("k", b"root").expect("set");
    assert_eq!(
        job.multi_get(&["k", "job1/k"]).expect("prefixed"),
        vec![Some(b"mine".to_vec()), None]
    );
    assert_eq!(
        root.multi_get(&["job1/k", "k"]).expect("root"),
        vec![Some(b"mine".to_vec()), Some(b"root".to_vec())]
    );
    assert_eq!(
        job.with_prefix("x/").multi_get(&["k"]).expect("nested"),
        vec![None]
    );
}

#[test]
fn multi_get_over_the_frame_limit_is_a_clear_error_and_the_connection_stays_usable() {
    let small = StoreConfig::new().with_max_frame_bytes(1024);
    let (s, addr) = serve(small.clone());
    let st = connect(&addr, small.clone());
    st.set("big", &[7u8; 600]).expect("a value that fits");
    assert_eq!(
        st.multi_get(&["big"]).expect("one fits"),
        vec![Some(vec![7u8; 600])]
    );
    // Two copies of it would be a 1,215-byte reply: refused, not truncated.
    let reason = protocol_reason(st.multi_get(&["big", "big"]).expect_err("over the limit"));
    assert!(
        reason.contains("exceed the store's frame limit (1215 bytes, the limit is 1024)")
            && reason.contains("read fewer keys at once"),
        "{reason}"
    );
    assert_eq!(st.get("big").expect("still connected"), vec![7u8; 600]);
    // A request that would not fit is refused before it is sent.
    let many: Vec<String> = (0..200).map(|i| format!("key-{i:05}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let reason = protocol_reason(st.multi_get(&many).expect_err("request over the limit"));
    assert!(
        reason.contains("1024 byte frame limit") && reason.contains("read fewer keys at once"),
        "{reason}"
    );
    assert_eq!(
        st.multi_get(&["big", "missing"]).expect("still connected"),
        vec![Some(vec![7u8; 600]), None]
    );
    assert_eq!(s.num_clients(), 1, "the server kept the client");
}

/// A client whose own limit is below the store's refuses a reply the store sent; it skips the
/// reply, so its next call reads its own.
#[test]
fn a_reply_over_the_clients_own_limit_is_skipped_and_the_connection_goes_on() {
    let (_s, addr) = serve(StoreConfig::new());
    let st = connect(&addr, StoreConfig::new().with_max_frame_bytes(1024));
    st.set("big", &[1u8; 600]).expect("set");
    let reason = protocol_reason(st.multi_get(&["big", "big"]).expect_err("over its limit"));
    assert!(
        reason.contains("reply of 1215 bytes exceeds this client's 1024 byte frame limit"),
        "{reason}"
    );
    assert_eq!(
        st.multi_get(&["missing", "big"])
            .expect("in step with the store"),
        vec![None, Some(vec![1u8; 600])]
    );
}

/// A `set` whose value does not fit in a frame is refused before it is sent: the server would
/// drop the connection every clone of the store shares (the process group's too), and later
/// calls would fail as if rank 0 had died.
#[test]
fn a_set_over_the_frame_limit_is_a_clear_error_and_the_shared_connection_stays_usable() {
    let small = StoreConfig::new().with_max_frame_bytes(1024);
    let (s, addr) = serve(small.clone());
    let st = connect(&addr, small.clone());
    let clone = st.clone();
    match st.set("big", &[1u8; 5000]).expect_err("over the limit") {
        CommError::StoreProtocol { op, reason } => {
            assert_eq!(op, "set");
            assert!(
                reason.contains("1024 byte frame limit")
                    && reason.contains("keep large values out of the store"),
                "{reason}"
            );
        }
        other => panic!("expected a store protocol error, got {other:?}"),
    }
    clone
        .set("small", b"ok")
        .expect("the shared connection still works");
    assert_eq!(st.get("small").expect("still connected"), b"ok");
    assert_eq!(s.num_clients(), 1, "the server kept the client");
}
