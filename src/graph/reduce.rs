//! Reducers (EXT-23): how a step's writes merge into the state, as a list
//! of positional operations. The same operations are the step's stored
//! delta (EXT-30a) and what the Python side applies to its copy of the
//! state, so both sides agree without either re-deciding.

use super::spec::{Graph, Reducer};
use super::{graph_error, plain_error};
use crate::error::CoreResult;
use serde_json::{json, Map, Value};

pub type State = Map<String, Value>;

/// One change to the state. JSON: `["set", k, v]`, `["extend", k, [..]]`,
/// `["put", k, i, v]`, `["del", k, i]`.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Set(String, Value),
    Extend(String, Vec<Value>),
    Put(String, usize, Value),
    Del(String, usize),
}

impl Op {
    pub fn to_json(&self) -> Value {
        match self {
            Op::Set(k, v) => json!(["set", k, v]),
            Op::Extend(k, items) => json!(["extend", k, items]),
            Op::Put(k, i, v) => json!(["put", k, i, v]),
            Op::Del(k, i) => json!(["del", k, i]),
        }
    }

    pub fn from_json(v: &Value) -> Option<Op> {
        let a = v.as_array()?;
        let key = a.get(1)?.as_str()?.to_string();
        match a.first()?.as_str()? {
            "set" => Some(Op::Set(key, a.get(2)?.clone())),
            "extend" => Some(Op::Extend(key, a.get(2)?.as_array()?.clone())),
            "put" => Some(Op::Put(
                key,
                a.get(2)?.as_u64()? as usize,
                a.get(3)?.clone(),
            )),
            "del" => Some(Op::Del(key, a.get(2)?.as_u64()? as usize)),
            _ => None,
        }
    }
}

/// Applies `op` to `state`. Operations come from `merge` (or a stored
/// delta it produced), so positions are valid; a stored delta that does
/// not fit is reported rather than applied wrongly.
pub fn apply(state: &mut State, op: Op) -> CoreResult<()> {
    let corrupt = |k: &str| {
        plain_error(
            "checkpoint_corrupt",
            format!("stored delta does not fit state key '{k}'"),
        )
    };
    match op {
        Op::Set(k, v) => {
            state.insert(k, v);
        }
        Op::Extend(k, items) => match state
            .entry(k.clone())
            .or_insert_with(|| Value::Array(vec![]))
        {
            Value::Array(list) => list.extend(items),
            _ => return Err(corrupt(&k)),
        },
        Op::Put(k, i, v) => match state.get_mut(&k) {
            Some(Value::Array(list)) if i < list.len() => list[i] = v,
            _ => return Err(corrupt(&k)),
        },
        Op::Del(k, i) => match state.get_mut(&k) {
            Some(Value::Array(list)) if i < list.len() => {
                list.remove(i);
            }
            _ => return Err(corrupt(&k)),
        },
    }
    Ok(())
}

fn replace_list(v: &Value) -> Option<&Vec<Value>> {
    let obj = v.as_object()?;
    if obj.len() != 1 {
        return None;
    }
    obj.get("$replace")?.as_array()
}

fn invalid(node: &str, key: &str, why: String) -> crate::error::CoreError {
    graph_error(
        "update_invalid",
        format!("node '{node}' wrote state key '{key}': {why}"),
        json!({"node": node, "key": key}),
    )
}

fn item_id(item: &Value) -> Option<&str> {
    item.as_object()?.get("id")?.as_str()
}

fn is_removal(item: &Value) -> bool {
    item.as_object()
        .and_then(|o| o.get("$remove"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Checks one write's shape against its reducer, before anything changes.
fn check_write(reducer: Reducer, node: &str, key: &str, value: &Value) -> CoreResult<()> {
    match reducer {
        Reducer::Replace => Ok(()),
        Reducer::Append => {
            if value.is_array() || replace_list(value).is_some() {
                Ok(())
            } else {
                Err(invalid(
                    node,
                    key,
                    "the 'append' reducer takes a list (or {\"$replace\": [...]})".into(),
                ))
            }
        }
        Reducer::UpsertById => {
            let items = match replace_list(value) {
                Some(items) => items,
                None => value.as_array().ok_or_else(|| {
                    invalid(node, key, "the 'upsert_by_id' reducer takes a list of objects with a string \"id\" (or {\"$replace\": [...]})".into())
                })?,
            };
            for (i, item) in items.iter().enumerate() {
                if item_id(item).is_none() {
                    return Err(invalid(
                        node,
                        key,
                        format!("item [{i}] is not an object with a string \"id\""),
                    ));
                }
            }
            Ok(())
        }
    }
}

/// Merges a step's writes (`(node, update)` in node-declaration order) into
/// `state` and returns the operations applied: the step's delta. Conflicts
/// and malformed writes are found before anything changes.
pub fn merge(graph: &Graph, state: &mut State, writes: &[(String, State)]) -> CoreResult<Vec<Op>> {
    let mut writers: Vec<(&str, Vec<&str>)> = Vec::new();
    for (node, update) in writes {
        for (key, value) in update {
            let reducer = graph.reducer(key);
            check_write(reducer, node, key, value)?;
            match writers.iter_mut().find(|(k, _)| *k == key.as_str()) {
                Some((_, nodes)) => nodes.push(node),
                None => writers.push((key, vec![node])),
            }
        }
    }
    for (key, nodes) in &writers {
        let reducer = graph.reducer(key);
        if reducer == Reducer::Replace && nodes.len() > 1 {
            return Err(graph_error(
                "update_conflict",
                format!(
                    "state key '{key}' was written by {} in the same step -- give it a list \
                     reducer ('append' or 'upsert_by_id') or let one node write it",
                    nodes
                        .iter()
                        .map(|n| format!("'{n}'"))
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
                json!({"key": key, "nodes": nodes}),
            ));
        }
        if reducer != Reducer::Replace {
            // The first write of the step decides whether the current value matters.
            let first = writes
                .iter()
                .find_map(|(_, u)| u.get(*key))
                .expect("a writer wrote the key");
            let replaces = replace_list(first).is_some();
            if !replaces && !matches!(state.get(*key), None | Some(Value::Array(_))) {
                return Err(invalid(
                    nodes[0],
                    key,
                    "the current value is not a list".into(),
                ));
            }
        }
    }
    let mut ops: Vec<Op> = Vec::new();
    for (_, update) in writes {
        for (key, value) in update {
            match (graph.reducer(key), replace_list(value)) {
                (Reducer::Replace, _) => {
                    emit(state, &mut ops, Op::Set(key.clone(), value.clone()))?
                }
                (_, Some(items)) => emit(
                    state,
                    &mut ops,
                    Op::Set(key.clone(), Value::Array(items.clone())),
                )?,
                (Reducer::Append, None) => {
                    let items = value.as_array().cloned().unwrap_or_default();
                    emit(state, &mut ops, Op::Extend(key.clone(), items))?
                }
                (Reducer::UpsertById, None) => {
                    for item in value.as_array().map(Vec::as_slice).unwrap_or(&[]) {
                        upsert(state, &mut ops, key, item)?;
                    }
                }
            }
        }
    }
    Ok(ops)
}

fn emit(state: &mut State, ops: &mut Vec<Op>, op: Op) -> CoreResult<()> {
    apply(state, op.clone())?;
    push_op(ops, op);
    Ok(())
}

/// One upsert item against the current list (earlier items of the step
/// already applied, so positions stay right).
fn upsert(state: &mut State, ops: &mut Vec<Op>, key: &str, item: &Value) -> CoreResult<()> {
    let id = item_id(item).unwrap_or_default();
    let at = match state.get(key) {
        Some(Value::Array(list)) => list.iter().position(|x| item_id(x) == Some(id)),
        _ => None,
    };
    match (at, is_removal(item)) {
        (Some(i), true) => emit(state, ops, Op::Del(key.to_string(), i)),
        (None, true) => Ok(()),
        (Some(i), false) => emit(state, ops, Op::Put(key.to_string(), i, item.clone())),
        (None, false) => emit(state, ops, Op::Extend(key.to_string(), vec![item.clone()])),
    }
}

/// Consecutive appends to one key are stored as one.
fn push_op(ops: &mut Vec<Op>, op: Op) {
    if let (Some(Op::Extend(lk, litems)), Op::Extend(k, items)) = (ops.last_mut(), &op) {
        if lk == k {
            litems.extend(items.iter().cloned());
            return;
        }
    }
    ops.push(op);
}

#[cfg(test)]
mod tests {
    use super::super::spec::{compile, Spec};
    use super::*;

    fn graph(reducers: &[(&str, &str)]) -> Graph {
        compile(Spec {
            name: "g".into(),
            nodes: vec!["a".into(), "b".into()],
            start: Some("a".into()),
            edges: vec![("a".into(), "b".into()), ("b".into(), "__end__".into())],
            reducers: reducers
                .iter()
                .map(|(k, r)| (k.to_string(), r.to_string()))
                .collect(),
            ..Default::default()
        })
        .unwrap()
    }

    fn obj(v: Value) -> State {
        v.as_object().unwrap().clone()
    }

    fn w(node: &str, v: Value) -> (String, State) {
        (node.to_string(), obj(v))
    }

    #[test]
    fn replace_sets_and_two_writers_conflict_without_changing_state() {
        let g = graph(&[]);
        let mut s = obj(json!({"x": 1}));
        let ops = merge(&g, &mut s, &[w("a", json!({"x": 2}))]).unwrap();
        assert_eq!(ops, vec![Op::Set("x".into(), json!(2))]);
        let err = merge(
            &g,
            &mut s,
            &[w("a", json!({"x": 3})), w("b", json!({"x": 4}))],
        )
        .unwrap_err();
        match err {
            crate::error::CoreError::Graph {
                code, details_json, ..
            } => {
                assert_eq!(code, "update_conflict");
                assert!(
                    details_json.contains("\"nodes\":[\"a\",\"b\"]"),
                    "{details_json}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s["x"], json!(2));
    }

    #[test]
    fn append_extends_in_declaration_order_and_replace_resets() {
        let g = graph(&[("notes", "append")]);
        let mut s = State::new();
        let ops = merge(
            &g,
            &mut s,
            &[
                w("a", json!({"notes": [1]})),
                w("b", json!({"notes": [2, 3]})),
            ],
        )
        .unwrap();
        assert_eq!(
            ops,
            vec![Op::Extend(
                "notes".into(),
                vec![json!(1), json!(2), json!(3)]
            )]
        );
        merge(&g, &mut s, &[w("a", json!({"notes": {"$replace": [9]}}))]).unwrap();
        assert_eq!(s["notes"], json!([9]));
        let err = merge(&g, &mut s, &[w("a", json!({"notes": 5}))]).unwrap_err();
        assert!(
            err.to_string().contains("'append' reducer takes a list"),
            "{err}"
        );
    }

    #[test]
    fn upsert_by_id_appends_replaces_in_place_and_removes() {
        let g = graph(&[("items", "upsert_by_id")]);
        let mut s = obj(json!({"items": [{"id": "a", "v": 1}, {"id": "b", "v": 2}]}));
        let ops = merge(
            &g,
            &mut s,
            &[w("a", json!({"items": [{"id": "b", "v": 20}, {"id": "c", "v": 3}, {"id": "a", "$remove": true}, {"id": "zz", "$remove": true}]}))],
        )
        .unwrap();
        assert_eq!(
            s["items"],
            json!([{"id": "b", "v": 20}, {"id": "c", "v": 3}])
        );
        assert_eq!(ops.len(), 3);
        let mut rebuilt = obj(json!({"items": [{"id": "a", "v": 1}, {"id": "b", "v": 2}]}));
        for op in ops {
            apply(&mut rebuilt, Op::from_json(&op.to_json()).unwrap()).unwrap();
        }
        assert_eq!(rebuilt, s);
        let err = merge(&g, &mut s, &[w("a", json!({"items": [{"v": 1}]}))]).unwrap_err();
        assert!(err.to_string().contains("string \"id\""), "{err}");
    }
}
