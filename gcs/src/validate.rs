//! Checks of every field a request brings from the network, before any
//! table sees it: lengths, characters, counts and amounts within bounds.
//! A request that breaks one is refused with `INVALID_ARGUMENT` and a
//! message naming the field, its limit and what was sent.

use crate::pb::{Demand, NodeInfo, Resource};
use tonic::Status;

/// The longest node or actor id (a node's is "node-" and 32 hex digits).
pub(crate) const MAX_ID_BYTES: usize = 64;
/// The longest address, host name, path or free-text field.
pub(crate) const MAX_TEXT_BYTES: usize = 4096;
/// The most resources one node declares (CPU, GPU, memory, custom ones).
pub(crate) const MAX_RESOURCES: usize = 1024;
/// The longest resource name.
pub(crate) const MAX_RESOURCE_NAME_BYTES: usize = 256;
/// The most waiting resource shapes one heartbeat reports.
pub(crate) const MAX_DEMANDS: usize = 1024;
/// The largest amount of one resource, in fixed-point units: 2^53, exact
/// in a float, far above any machine's memory in bytes.
pub(crate) const MAX_UNITS: i64 = 1 << 53;
/// The most exited processes one heartbeat tells.
pub(crate) const MAX_EXITS: usize = 10_000;
/// The longest key-value key, actor name or namespace.
pub(crate) const MAX_KEY_BYTES: usize = 4096;

fn invalid(field: &str, why: String) -> Status {
    Status::invalid_argument(format!("{field}: {why}"))
}

/// What the peer sent, cut short for a message.
fn shown(text: &str) -> String {
    let cut: String = text.chars().take(40).collect();
    if cut.len() < text.len() {
        format!("{cut:?}... ({} bytes)", text.len())
    } else {
        format!("{cut:?}")
    }
}

/// An id: 1 to 64 ASCII letters, digits, '-' and '_'.
pub(crate) fn id(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(invalid(field, "is empty".into()));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(invalid(
            field,
            format!("is longer than {MAX_ID_BYTES} bytes: {}", shown(value)),
        ));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(invalid(
            field,
            format!(
                "holds characters other than ASCII letters, digits, '-' and '_': {}",
                shown(value)
            ),
        ));
    }
    Ok(())
}

/// Free text: at most `max` bytes, no control characters.
pub(crate) fn text(field: &str, value: &str, max: usize) -> Result<(), Status> {
    if value.len() > max {
        return Err(invalid(
            field,
            format!("is longer than {max} bytes: {}", shown(value)),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(
            field,
            format!("holds control characters: {}", shown(value)),
        ));
    }
    Ok(())
}

fn resources(field: &str, list: &[Resource]) -> Result<(), Status> {
    if list.len() > MAX_RESOURCES {
        return Err(invalid(
            field,
            format!("names {} resources; at most {MAX_RESOURCES}", list.len()),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for r in list {
        if r.name.is_empty() {
            return Err(invalid(field, "a resource has no name".into()));
        }
        text(field, &r.name, MAX_RESOURCE_NAME_BYTES)?;
        if !(0..=MAX_UNITS).contains(&r.units) {
            return Err(invalid(
                field,
                format!(
                    "resource {} has {} units; an amount is 0 to {MAX_UNITS}",
                    shown(&r.name),
                    r.units
                ),
            ));
        }
        if !seen.insert(r.name.as_str()) {
            return Err(invalid(
                field,
                format!("resource {} is named twice", shown(&r.name)),
            ));
        }
    }
    Ok(())
}

fn demands(list: &[Demand]) -> Result<(), Status> {
    if list.len() > MAX_DEMANDS {
        return Err(invalid(
            "demands",
            format!("lists {} shapes; at most {MAX_DEMANDS}", list.len()),
        ));
    }
    list.iter().try_for_each(|d| resources("demands", &d.shape))
}

/// A key-value key, an actor's name or namespace: at most 4 KiB.
pub(crate) fn key(field: &str, value: &str) -> Result<(), Status> {
    if value.len() > MAX_KEY_BYTES {
        return Err(invalid(
            field,
            format!("is longer than {MAX_KEY_BYTES} bytes: {}", shown(value)),
        ));
    }
    Ok(())
}

/// A node registering.
pub(crate) fn node(node: &NodeInfo) -> Result<(), Status> {
    id("node_id", &node.node_id)?;
    if node.node_ip.is_empty() {
        return Err(invalid("node_ip", "is empty".into()));
    }
    text("node_ip", &node.node_ip, 255)?;
    text("hostname", &node.hostname, 255)?;
    text("session_dir", &node.session_dir, MAX_TEXT_BYTES)?;
    text("raylet_address", &node.raylet_address, MAX_TEXT_BYTES)?;
    text("death_cause", &node.death_cause, MAX_TEXT_BYTES)?;
    resources("total", &node.total)?;
    resources("available", &node.available)?;
    demands(&node.demands)
}

/// A heartbeat.
pub(crate) fn heartbeat(
    node_id: &str,
    available: &[Resource],
    waiting: &[Demand],
) -> Result<(), Status> {
    id("node_id", node_id)?;
    resources("available", available)?;
    demands(waiting)
}

/// The addresses of the processes a heartbeat says exited.
pub(crate) fn exited(addresses: &[String]) -> Result<(), Status> {
    if addresses.len() > MAX_EXITS {
        return Err(invalid(
            "exited",
            format!("holds {} addresses, more than {MAX_EXITS}", addresses.len()),
        ));
    }
    addresses
        .iter()
        .try_for_each(|a| text("exited", a, MAX_TEXT_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_named(id: &str) -> NodeInfo {
        NodeInfo {
            node_id: id.into(),
            node_ip: "10.0.0.1".into(),
            ..NodeInfo::default()
        }
    }

    #[test]
    fn too_many_exits_or_a_bad_address_in_a_heartbeat_are_refused_by_name() {
        let many = vec!["10.0.0.1:4000".to_string(); MAX_EXITS + 1];
        let e = exited(&many).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message()
                .contains("exited: holds 10001 addresses, more than 10000"),
            "{e:?}"
        );
        let e = exited(&["10.0.0.1\n:4000".to_string()]).unwrap_err();
        assert!(
            e.message().contains("exited: holds control characters"),
            "{e:?}"
        );
        assert!(exited(&["10.0.0.1:4000".to_string()]).is_ok());
    }

    #[test]
    fn an_empty_or_huge_node_id_is_invalid_not_taken() {
        let empty = node(&node_named("")).unwrap_err();
        assert_eq!(empty.code(), tonic::Code::InvalidArgument);
        assert!(empty.message().contains("node_id: is empty"), "{empty:?}");
        let huge = node(&node_named(&"n".repeat(1 << 20))).unwrap_err();
        assert!(huge.message().contains("longer than 64 bytes"), "{huge:?}");
        assert!(
            huge.message().len() < 200,
            "the message does not echo a megabyte"
        );
        assert!(node(&node_named("node-0123abcd")).is_ok());
    }

    #[test]
    fn resources_are_bounded_in_count_and_amount() {
        let mut n = node_named("node-a");
        n.total = (0..50_000)
            .map(|i| Resource {
                name: format!("r{i}"),
                units: i64::MAX,
            })
            .collect();
        assert!(node(&n).unwrap_err().message().contains("at most 1024"));
        n.total.truncate(3);
        assert!(node(&n)
            .unwrap_err()
            .message()
            .contains("an amount is 0 to"));
        n.total = vec![Resource {
            name: "CPU".into(),
            units: -1,
        }];
        assert!(node(&n).is_err());
        n.total = vec![
            Resource {
                name: "CPU".into(),
                units: 1,
            },
            Resource {
                name: "CPU".into(),
                units: 2,
            },
        ];
        assert!(node(&n).unwrap_err().message().contains("named twice"));
    }
}
