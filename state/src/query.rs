//! What a state query asks: the kind of rows, filters on their fields, a
//! limit; and how rows are filtered and cut to it.

use crate::error::StateError;
use serde_json::Value;

/// The kinds of rows the state API lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The cluster's nodes, from the head's table (dead ones too).
    Nodes,
    /// Jobs: submissions and drivers.
    Jobs,
    /// Actors, dead ones with their death cause.
    Actors,
    /// Tasks and actor calls that ended, as each node keeps them.
    Tasks,
    /// Objects in the nodes' stores.
    Objects,
    /// Worker processes.
    Workers,
    /// Placement groups.
    PlacementGroups,
}

impl Kind {
    /// Every kind, as the CLI and the routes name them.
    pub const ALL: [Kind; 7] = [
        Kind::Nodes,
        Kind::Jobs,
        Kind::Actors,
        Kind::Tasks,
        Kind::Objects,
        Kind::Workers,
        Kind::PlacementGroups,
    ];

    /// Its name in routes and on the command line (`placement-groups` is
    /// taken for `placement_groups` too).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Nodes => "nodes",
            Kind::Jobs => "jobs",
            Kind::Actors => "actors",
            Kind::Tasks => "tasks",
            Kind::Objects => "objects",
            Kind::Workers => "workers",
            Kind::PlacementGroups => "placement_groups",
        }
    }

    /// The kind named `name`, or an error listing the kinds.
    pub fn parse(name: &str) -> Result<Kind, StateError> {
        let name = name.replace('-', "_");
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                StateError::BadRequest(format!(
                    "unknown kind {name:?}: the kinds are {}",
                    Kind::ALL.map(|k| k.name().replace('_', "-")).join(", ")
                ))
            })
    }

    /// The field that identifies a row.
    pub fn id_field(self) -> &'static str {
        match self {
            Kind::Nodes => "node_id",
            Kind::Jobs => "submission_id",
            Kind::Actors => "actor_id",
            Kind::Tasks => "task_id",
            Kind::Objects => "object_id",
            Kind::Workers => "worker_id",
            Kind::PlacementGroups => "placement_group_id",
        }
    }

    /// The fields a table shows (every field with `--detail`), and the
    /// fields a filter may name.
    pub fn columns(self) -> &'static [&'static str] {
        match self {
            Kind::Nodes => &[
                "node_id",
                "node_ip",
                "is_head_node",
                "state",
                "resources_total",
                "death_cause",
            ],
            Kind::Jobs => &[
                "job_id",
                "submission_id",
                "type",
                "status",
                "entrypoint",
                "start_time",
                "end_time",
            ],
            Kind::Actors => &[
                "actor_id",
                "class_name",
                "state",
                "name",
                "job_id",
                "pid",
                "node_id",
                "num_restarts",
                "death_cause",
            ],
            Kind::Tasks => &[
                "task_id",
                "name",
                "state",
                "job_id",
                "node_id",
                "retries",
                "error_message",
            ],
            Kind::Objects => &[
                "object_id",
                "object_size",
                "location",
                "reference_type",
                "pins",
                "node_id",
                "owner",
            ],
            Kind::Workers => &[
                "worker_id",
                "pid",
                "state",
                "job_id",
                "actor_id",
                "node_id",
                "blocked",
            ],
            Kind::PlacementGroups => &[
                "placement_group_id",
                "name",
                "state",
                "strategy",
                "job_id",
                "node_id",
            ],
        }
    }

    /// Whether its rows come from every node (not from the head's own
    /// tables).
    pub fn from_nodes(self) -> bool {
        !matches!(self, Kind::Nodes | Kind::Jobs)
    }
}

/// How a filter compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Predicate {
    /// The field equals the value.
    Equal,
    /// The field differs from the value.
    NotEqual,
}

impl Predicate {
    /// Its spelling in a query (`=`, `!=`).
    pub fn as_str(self) -> &'static str {
        match self {
            Predicate::Equal => "=",
            Predicate::NotEqual => "!=",
        }
    }
}

/// One filter on a field; values compare without regard to case, as
/// Ray's do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// The field.
    pub key: String,
    /// How it compares.
    pub predicate: Predicate,
    /// The value.
    pub value: String,
}

impl Filter {
    /// Parses `key=value` or `key!=value`.
    pub fn parse(text: &str) -> Result<Filter, StateError> {
        let (key, predicate, value) = if let Some((k, v)) = text.split_once("!=") {
            (k, Predicate::NotEqual, v)
        } else if let Some((k, v)) = text.split_once('=') {
            (k, Predicate::Equal, v)
        } else {
            return Err(StateError::BadRequest(format!(
                "the filter {text:?} is not key=value or key!=value"
            )));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(StateError::BadRequest(format!(
                "the filter {text:?} names no field"
            )));
        }
        Ok(Filter {
            key: key.to_string(),
            predicate,
            value: value.trim().to_string(),
        })
    }

    fn matches(&self, row: &Value) -> bool {
        let field = match row.get(&self.key) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        let equal = field.eq_ignore_ascii_case(&self.value);
        match self.predicate {
            Predicate::Equal => equal,
            Predicate::NotEqual => !equal,
        }
    }
}

/// The most rows one answer holds.
pub const MAX_LIMIT: usize = 10_000;
/// Rows an answer holds when no limit is given (Ray's default).
pub const DEFAULT_LIMIT: usize = 100;

/// A state query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// What to list.
    pub kind: Kind,
    /// Every filter must hold.
    pub filters: Vec<Filter>,
    /// At most this many rows (1 to [`MAX_LIMIT`]).
    pub limit: usize,
}

impl Query {
    /// A query of `kind` with the default limit and no filter.
    pub fn new(kind: Kind) -> Query {
        Query {
            kind,
            filters: Vec::new(),
            limit: DEFAULT_LIMIT,
        }
    }

    /// Checks the limit and that each filter names a field of the kind.
    pub fn check(&self) -> Result<(), StateError> {
        if self.limit == 0 || self.limit > MAX_LIMIT {
            return Err(StateError::BadRequest(format!(
                "limit {} is out of range: give 1 to {MAX_LIMIT}",
                self.limit
            )));
        }
        let columns = self.kind.columns();
        for f in &self.filters {
            if !columns.contains(&f.key.as_str()) {
                return Err(StateError::BadRequest(format!(
                    "{} have no field {:?} to filter on; the fields are {}",
                    self.kind.name(),
                    f.key,
                    columns.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Parses Ray's query string: `limit`, and `filter_keys`,
    /// `filter_predicates` and `filter_values` repeated in step.
    pub fn from_pairs(kind: Kind, pairs: &[(String, String)]) -> Result<Query, StateError> {
        let mut query = Query::new(kind);
        let (mut keys, mut predicates, mut values) = (Vec::new(), Vec::new(), Vec::new());
        for (k, v) in pairs {
            match k.as_str() {
                "limit" => {
                    query.limit = v.parse().map_err(|_| {
                        StateError::BadRequest(format!(
                            "limit {v:?} is not a whole number (give 1 to {MAX_LIMIT})"
                        ))
                    })?
                }
                "filter_keys" => keys.push(v.clone()),
                "filter_predicates" => predicates.push(match v.as_str() {
                    "=" => Predicate::Equal,
                    "!=" => Predicate::NotEqual,
                    other => {
                        return Err(StateError::BadRequest(format!(
                            "filter predicate {other:?} is not = or !="
                        )))
                    }
                }),
                "filter_values" => values.push(v.clone()),
                // Ray's clients send these; every answer here is whole.
                "detail" | "timeout" | "exclude_driver" => {}
                other => {
                    return Err(StateError::BadRequest(format!(
                        "unknown query parameter {other:?}: the parameters are limit, \
                         filter_keys, filter_predicates, filter_values and detail"
                    )))
                }
            }
        }
        if keys.len() != predicates.len() || keys.len() != values.len() {
            return Err(StateError::BadRequest(format!(
                "filters need as many filter_keys ({}), filter_predicates ({}) and \
                 filter_values ({})",
                keys.len(),
                predicates.len(),
                values.len()
            )));
        }
        query.filters = keys
            .into_iter()
            .zip(predicates)
            .zip(values)
            .map(|((key, predicate), value)| Filter {
                key,
                predicate,
                value,
            })
            .collect();
        query.check()?;
        Ok(query)
    }

    /// The query as a path and query string of the head's routes.
    pub fn to_path(&self) -> String {
        let mut path = format!("/api/v0/{}?limit={}", self.kind.name(), self.limit);
        for f in &self.filters {
            path.push_str(&format!(
                "&filter_keys={}&filter_predicates={}&filter_values={}",
                encode(&f.key),
                encode(f.predicate.as_str()),
                encode(&f.value)
            ));
        }
        path
    }

    /// Keeps the rows every filter holds for.
    pub fn keep(&self, row: &Value) -> bool {
        self.filters.iter().all(|f| f.matches(row))
    }
}

/// A query value percent-encoded (everything but unreserved characters).
///
/// ```
/// assert_eq!(prism_state::encode("a b/c"), "a%20b%2Fc");
/// ```
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn filters_parse_and_match_without_regard_to_case() {
        let f = Filter::parse("state=alive").unwrap();
        assert_eq!(f.predicate, Predicate::Equal);
        assert!(f.matches(&json!({"state": "ALIVE"})));
        let f = Filter::parse(" pid != 7 ").unwrap();
        assert_eq!((f.key.as_str(), f.value.as_str()), ("pid", "7"));
        assert!(!f.matches(&json!({"pid": 7})));
        assert!(f.matches(&json!({"pid": null})));
        assert!(Filter::parse("state").is_err());
        assert!(Filter::parse("=x").is_err());
    }

    #[test]
    fn queries_check_their_kind_fields_and_limit() {
        assert_eq!(
            Kind::parse("placement-groups").unwrap(),
            Kind::PlacementGroups
        );
        let e = Kind::parse("widgets").unwrap_err().to_string();
        assert!(e.contains("placement-groups"), "{e}");
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let q = Query::from_pairs(
            Kind::Actors,
            &pairs(&[
                ("limit", "5"),
                ("filter_keys", "state"),
                ("filter_predicates", "!="),
                ("filter_values", "DEAD"),
            ]),
        )
        .unwrap();
        assert_eq!(q.limit, 5);
        assert_eq!(
            q.to_path(),
            "/api/v0/actors?limit=5&filter_keys=state&filter_predicates=%21%3D&filter_values=DEAD"
        );
        for bad in [
            vec![("limit", "0")],
            vec![("limit", "10001")],
            vec![("limit", "many")],
            vec![
                ("filter_keys", "colour"),
                ("filter_predicates", "="),
                ("filter_values", "x"),
            ],
            vec![("filter_keys", "state")],
            vec![
                ("filter_keys", "state"),
                ("filter_predicates", "<"),
                ("filter_values", "x"),
            ],
            vec![("shape", "x")],
        ] {
            assert!(
                Query::from_pairs(Kind::Actors, &pairs(&bad)).is_err(),
                "{bad:?}"
            );
        }
    }
}
