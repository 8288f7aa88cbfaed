use super::*;

const fn range(min: u8, max: u8) -> VersionRange {
    VersionRange { min, max }
}

#[test]
fn equal_ranges_agree_on_that_version() {
    assert_eq!(
        negotiate(SERVER_VERSIONS, SERVER_VERSIONS),
        Ok(PROTO_VERSION)
    );
    assert_eq!(negotiate(range(2, 2), range(2, 2)), Ok(2));
}

#[test]
fn newer_client_is_downgraded_to_the_server_max() {
    assert_eq!(negotiate(range(2, 3), range(2, 2)), Ok(2));
    // And an older client keeps its own max when the server speaks newer ones too.
    assert_eq!(negotiate(range(2, 3), range(2, 5)), Ok(3));
}

#[test]
fn disjoint_ranges_are_rejected_both_ways() {
    let fail = Err(Status::ProtoVersionNegotiationFail);
    assert_eq!(negotiate(range(3, 4), range(2, 2)), fail, "client too new");
    assert_eq!(negotiate(range(1, 1), range(2, 2)), fail, "client too old");
}

#[test]
fn empty_ranges_are_rejected() {
    let fail = Err(Status::ProtoVersionNegotiationFail);
    assert_eq!(
        negotiate(range(3, 2), range(2, 3)),
        fail,
        "client min > max"
    );
    assert_eq!(
        negotiate(range(2, 3), range(3, 2)),
        fail,
        "server min > max"
    );
}
