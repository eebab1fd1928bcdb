use std::collections::HashMap;

use super::*;

/// Operands from a map of names to values.
struct Props(HashMap<&'static str, Val>);

impl Operands for Props {
    fn get(&self, name: &str) -> Val {
        self.0.get(name).cloned().unwrap_or(Val::Null)
    }
}

fn props(pairs: &[(&'static str, Val)]) -> Props {
    Props(pairs.iter().cloned().collect())
}

fn s(v: &str) -> Val {
    Val::Str(v.into())
}

fn eval(selector: &str, p: &Props) -> bool {
    Selector::parse(selector)
        .unwrap_or_else(|e| panic!("{selector}: {e}"))
        .matches(p)
}

/// SEL-9: the specification's test vector.
#[test]
fn sel_9_color_and_size() {
    let sel = "color = 'red' AND size > 2";
    let cases = [
        (props(&[("color", s("red")), ("size", Val::Long(5))]), true),
        (props(&[("color", s("red")), ("size", Val::Long(3))]), true),
        (
            props(&[("color", s("blue")), ("size", Val::Long(9))]),
            false,
        ),
        (props(&[("color", s("red")), ("size", Val::Long(1))]), false),
        (props(&[("size", Val::Long(8))]), false),
    ];
    for (p, want) in cases {
        assert_eq!(eval(sel, &p), want, "{:?}", p.0);
    }
}

/// SEL-7: three-valued logic — absent properties are NULL, comparisons with NULL, type
/// mismatches and division by zero are UNKNOWN, and UNKNOWN withholds like FALSE, including
/// under NOT; OR with TRUE and AND with FALSE decide regardless.
#[test]
fn sel_7_three_valued_logic() {
    let p = props(&[("n", Val::Long(3)), ("t", s("x")), ("b", Val::Bool(true))]);
    let table = [
        ("missing = 1", false),
        ("NOT (missing = 1)", false),
        ("missing <> 1", false),
        ("missing = 1 OR n = 3", true),
        ("missing = 1 AND n = 3", false),
        ("NOT (missing = 1 AND n = 4)", true),
        ("t = 3", false),
        ("NOT (t = 3)", false),
        ("n / 0 = 1", false),
        ("NOT (n / 0 = 1)", false),
        ("n / 0.0 > 0", false),
        ("missing IN ('a', 'b')", false),
        ("NOT (missing IN ('a'))", false),
        ("missing IS NULL", true),
        ("n IS NOT NULL", true),
        ("n IS NULL", false),
        ("b", true),
        ("NOT b", false),
        ("t", false),
        ("b = TRUE", true),
        ("missing LIKE 'x'", false),
        ("n LIKE 'x'", false),
    ];
    for (sel, want) in table {
        assert_eq!(eval(sel, &p), want, "{sel}");
    }
}

/// SEL-8: string comparison is case-sensitive; strings compare for equality only.
#[test]
fn sel_8_strings() {
    let p = props(&[("c", s("Red"))]);
    assert!(!eval("c = 'red'", &p));
    assert!(eval("c = 'Red'", &p));
    assert!(eval("c <> 'red'", &p));
    assert!(!eval("c > 'A'", &p), "ordering strings is UNKNOWN");
}

/// LIKE with `%`, `_` and ESCAPE; IN; BETWEEN; arithmetic with promotion; literals.
#[test]
fn operators() {
    let p = props(&[
        ("name", s("a_b%c")),
        ("word", s("hello")),
        ("n", Val::Long(7)),
        ("x", Val::Double(2.5)),
        ("big", Val::Long(i64::MAX)),
    ]);
    let table = [
        ("word LIKE 'h%'", true),
        ("word LIKE 'h_llo'", true),
        ("word LIKE 'H%'", false),
        ("word NOT LIKE '%z%'", true),
        ("name LIKE 'a!_b!%c' ESCAPE '!'", true),
        ("word LIKE 'a!_%' ESCAPE '!'", false),
        ("name LIKE 'a\\_b%' ESCAPE '\\'", true),
        ("word IN ('x', 'hello')", true),
        ("word NOT IN ('x', 'y')", true),
        ("n IN (7, 8)", true),
        ("n BETWEEN 5 AND 7", true),
        ("n BETWEEN 8 AND 9", false),
        ("n NOT BETWEEN 8 AND 9", true),
        ("x BETWEEN 2 AND 3", true),
        ("n + 1 = 8", true),
        ("n * 2 - 4 = 10", true),
        ("n / 2 = 3", true),
        ("x * 2 = 5", true),
        ("-n = -7", true),
        ("n = 7.0", true),
        ("big + 1 > 0", true),
        ("n = 0x7", true),
        ("n > 6.5e0", true),
        ("n = 7L", true),
        ("(n > 1 AND (word = 'hello' OR n < 0))", true),
        ("word = 'it''s'", false),
    ];
    for (sel, want) in table {
        assert_eq!(eval(sel, &p), want, "{sel}");
    }
    assert!(eval("q = 'it''s'", &props(&[("q", s("it's"))])));
}

/// SEL-5: the limits and syntax errors, each naming what is wrong and where.
#[test]
fn sel_5_refusals() {
    let long = format!("a = '{}'", "x".repeat(MAX_BYTES));
    let e = Selector::parse(&long).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("invalid selector: selector longer"),
        "{e}"
    );
    let many = (0..40)
        .map(|i| format!("p{i} = 1"))
        .collect::<Vec<_>>()
        .join(" OR ");
    let e = Selector::parse(&many).unwrap_err();
    assert!(e.to_string().contains("too complex"), "{e}");
    let deep = format!("{}a = 1{}", "(".repeat(100), ")".repeat(100));
    assert!(Selector::parse(&deep)
        .unwrap_err()
        .to_string()
        .contains("nested"));
    for (bad, names) in [
        ("color = ", "unexpected end"),
        ("color == 'red'", "\"=\""),
        ("color = 'red", "unterminated string"),
        ("a LIKE 'x' ESCAPE 'ab'", "escape must be one character"),
        ("a IS 3", "\"3\""),
        ("a # 1", "\"#\""),
        ("a IN ()", "\")\""),
        ("AND", "\"AND\""),
    ] {
        let e = Selector::parse(bad).unwrap_err().to_string();
        assert!(e.starts_with("invalid selector: "), "{e}");
        assert!(e.contains(names), "{bad}: {e}");
    }
    assert_eq!(
        Selector::parse("a = 1 b").unwrap_err().at,
        6,
        "the position of the offending token"
    );
}

/// SEL-6: JMS header names read the envelope's header and properties fields; everything else
/// is an application property; the body is never read.
#[test]
fn sel_6_envelope_operands() {
    let metadata = r#"{"amqp10":{"props":{"message_id":"m-1","correlation_id":{"$u64":"42"},"subject":"order","priority":7,"creation_time":{"$ts":1700000000000}},"app":{"color":"red","size":{"$i32":5},"ratio":{"$f64":0.5}},"body_section":"data"}}"#;
    let o = EnvelopeOperands::new(metadata);
    let t = |sel: &str| Selector::parse(sel).unwrap().matches(&o);
    assert!(t("JMSMessageID = 'm-1'"));
    assert!(t("JMSCorrelationID = '42'"));
    assert!(t("JMSType = 'order'"));
    assert!(t("JMSPriority = 7"));
    assert!(t("JMSTimestamp > 0"));
    assert!(t("color = 'red' AND size = 5 AND ratio < 1"));
    assert!(t("body IS NULL"));
    let plain = EnvelopeOperands::new("not json");
    assert!(Selector::parse("JMSPriority = 4").unwrap().matches(&plain));
    assert!(!Selector::parse("color = 'red'").unwrap().matches(&plain));
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 2000, ..Default::default() })]

    /// Any text parses or is refused — never a panic — and a parsed selector evaluates on any
    /// operands without one.
    #[test]
    fn any_text_parses_or_is_refused(text in "[ -~]{0,120}") {
        if let Ok(sel) = Selector::parse(&text) {
            let _ = sel.matches(&props(&[("a", Val::Long(1)), ("b", s("x"))]));
        }
    }

    /// Texts made of selector tokens (more likely to parse, and to reach the evaluator).
    #[test]
    fn token_soup_parses_or_is_refused(parts in proptest::collection::vec(proptest::sample::select(vec![
        "a", "b", "=", "<>", "<", ">=", "AND", "OR", "NOT", "(", ")", "1", "2.5", "'x'", "+", "-",
        "*", "/", "0", "IN", ",", "BETWEEN", "LIKE", "'%'", "ESCAPE", "'!'", "IS", "NULL", "TRUE",
    ]), 0..40)) {
        let text = parts.join(" ");
        if let Ok(sel) = Selector::parse(&text) {
            let _ = sel.matches(&props(&[("a", Val::Long(0)), ("b", Val::Double(1.0))]));
        }
    }
}
