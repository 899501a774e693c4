//! The fields of an execute_code result.

use flowrepl_tests::{Kernel, MODES};
use serde_json::{json, Value};

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn namespace_persists_and_functions_see_later_names() {
    let mut k = Kernel::start();
    k.ok("def f():\n    return later * 2");
    k.ok("later = 21");
    assert_eq!(k.ok("f()")["result"], "42");
    k.ok("class A:\n    def m(self): return f()");
    assert_eq!(k.ok("A().m()")["result"], "42");
    // One dict: a comprehension inside a function defined in a cell sees globals.
    assert_eq!(k.ok("[later for _ in range(2)]")["result"], "[21, 21]");
}

#[test]
fn every_documented_field_is_present() {
    let mut k = Kernel::start();
    let r = k.ok("import json\nprint('out')\nimport sys; print('err', file=sys.stderr)\nvalue = {'a': 1}\nvalue");
    assert_eq!(r["stdout"], "out\n");
    assert_eq!(r["stderr"], "err\n");
    assert_eq!(r["result"], "{'a': 1}");
    assert_eq!(r["error"], Value::Null);
    assert_eq!(r["execution_count"], 1);
    assert!(r["elapsed_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(r["mode"], "in_process");
    assert_eq!(r["timed_out"], false);
    assert_eq!(strings(&r["added_vars"]), ["json", "sys", "value"]);
    assert_eq!(strings(&r["removed_vars"]), Vec::<String>::new());
    let imports = strings(&r["added_imports"]);
    assert!(
        imports.contains(&"json".to_owned()) && imports.contains(&"json.decoder".to_owned()),
        "{imports:?}"
    );
    let mut sorted = imports.clone();
    sorted.sort();
    assert_eq!(imports, sorted);
    assert_eq!(r["variable_count"], 3);
    let ts = r["timestamp"].as_str().unwrap();
    assert_eq!(ts.len(), 24, "{ts}");
    assert!(
        ts.ends_with('Z') && ts.as_bytes()[10] == b'T' && ts.as_bytes()[19] == b'.',
        "{ts}"
    );
    assert_eq!(r["warnings"], json!([]));
    let d = &r["debug_info"];
    assert_eq!(d["execution"], "success");
    assert_eq!(d["execution_mode"], "in_process");
    assert_eq!(d["elapsed_ms"], r["elapsed_ms"]);
    for p in ["compile", "exec", "capture", "diff"] {
        assert!(d["phases_us"][p].is_u64(), "{p}");
    }
}

#[test]
fn removed_and_readded_names() {
    let mut k = Kernel::start();
    k.ok("a = 1; b = 2; c = 3");
    let r = k.ok("del a, c\nd = 4");
    assert_eq!(strings(&r["removed_vars"]), ["a", "c"]);
    assert_eq!(strings(&r["added_vars"]), ["d"]);
    assert_eq!(r["variable_count"], 2);
    // Deleted and bound again in one cell: neither added nor removed.
    let r = k.ok("del b\nb = 5");
    assert_eq!(r["added_vars"], json!([]));
    assert_eq!(r["removed_vars"], json!([]));
    // Rebinding an existing name is not an addition.
    let r = k.ok("d = 'x'");
    assert_eq!(r["added_vars"], json!([]));
    let r = k.ok("globals().clear()");
    assert!(strings(&r["removed_vars"]).contains(&"__name__".to_owned()));
    assert_eq!(r["variable_count"], 0);
}

#[test]
fn diff_is_right_with_ten_thousand_globals() {
    let mut k = Kernel::start();
    let r = k.ok("for i in range(10_000):\n    globals()[f'v{i}'] = i");
    assert_eq!(r["added_vars"].as_array().unwrap().len(), 10_001); // + i
    let r = k.ok("del v5000\nnew_name = 1\nv9999 = 0");
    assert_eq!(strings(&r["removed_vars"]), ["v5000"]);
    assert_eq!(strings(&r["added_vars"]), ["new_name"]);
    assert_eq!(r["variable_count"], 10_001);
}

#[test]
fn errors_keep_output_and_append_the_traceback() {
    let mut k = Kernel::start();
    let r = k.execute("print('before')\nimport sys\nsys.stderr.write('warn\\n')\ndef g():\n    raise ValueError('bad value')\ng()");
    assert_eq!(r["success"], false);
    assert_eq!(r["stdout"], "before\n");
    let err = &r["error"];
    assert_eq!(err["type"], "ValueError");
    assert_eq!(err["message"], "bad value");
    let tb = err["traceback"].as_str().unwrap();
    assert!(tb.starts_with("Traceback (most recent call last):"), "{tb}");
    assert!(
        tb.contains("File \"<cell-1>\", line 6, in <module>"),
        "{tb}"
    );
    assert!(
        tb.contains("raise ValueError('bad value')"),
        "source line shown: {tb}"
    );
    assert_eq!(r["stderr"], format!("warn\n{tb}"));
    assert_eq!(r["debug_info"]["execution"], "runtime_error");
    // A function defined in an earlier cell shows its source in a later traceback.
    let r = k.execute("g()");
    assert!(r["error"]["traceback"]
        .as_str()
        .unwrap()
        .contains("File \"<cell-1>\", line 5, in g"));
}

#[test]
fn only_cells_that_leave_code_behind_are_kept_for_tracebacks() {
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        k.ok("import linecache\nbase = len(linecache.cache)\ndef f():\n    return 1 / 0");
        for i in 0..200 {
            k.ok(&format!("x = {i}"));
        }
        k.ok("g = (1 / v for v in [0])\nh = lambda: f()");
        k.ok("class C:\n    def m(self):\n        raise KeyError('k')");
        // What runs after its cell can still show its source; plain cells are not kept.
        let r = k.execute("len(linecache.cache) - base");
        assert_eq!(r["result"], "3", "{mode}: {r}");
        for (call, line) in [
            ("h()", "return 1 / 0"),
            ("next(g)", "g = (1 / v for v in [0])"),
            ("C().m()", "raise KeyError('k')"),
        ] {
            let r = k.execute(call);
            let tb = r["error"]["traceback"].as_str().unwrap();
            assert!(tb.contains(line), "{mode}: {call}: {tb}");
        }
    }
}

#[test]
fn syntax_errors() {
    let mut k = Kernel::start();
    let r = k.execute("x = = 1");
    assert_eq!(r["success"], false);
    assert_eq!(r["error"]["type"], "SyntaxError");
    assert_eq!(r["debug_info"]["execution"], "syntax_error");
    assert!(r["stderr"].as_str().unwrap().contains("SyntaxError"));
    let r = k.execute("x = 1\0");
    assert_eq!(r["debug_info"]["execution"], "syntax_error");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("null bytes"));
    // Nothing of a cell that does not compile runs.
    let r = k.execute("ran = True\nif:");
    assert_eq!(r["debug_info"]["execution"], "syntax_error");
    assert_eq!(k.execute("ran")["error"]["type"], "NameError");
}

#[test]
fn final_expression_value_like_jupyter() {
    let mut k = Kernel::start();
    assert_eq!(k.ok("x = 5")["result"], Value::Null);
    assert_eq!(k.ok("x")["result"], "5");
    assert_eq!(k.ok("None")["result"], Value::Null);
    assert_eq!(k.ok("print('p')")["result"], Value::Null);
    assert_eq!(k.ok("'text'")["result"], "'text'");
    assert_eq!(k.ok("x = 1; x + 1")["result"], "2");
    assert_eq!(
        k.ok("x;")["result"],
        Value::Null,
        "a trailing semicolon hides the value"
    );
    assert_eq!(k.ok("for i in range(3):\n    i")["result"], Value::Null);
    assert_eq!(k.ok("if True: a = 1; a")["result"], Value::Null);
    assert_eq!(k.ok("y = (1 +\n     2)\ny")["result"], "3");
    assert!(k.ok("lambda q=1: q")["result"]
        .as_str()
        .unwrap()
        .starts_with("<function <lambda>"));
    assert_eq!(k.ok("x == 1")["result"], "True");
    // The last statement runs once, after the rest.
    assert_eq!(
        k.ok("calls = []\ncalls.append(1)\nlen(calls)")["result"],
        "1"
    );
    // A repr that raises makes the cell fail.
    let r = k.execute("class Bad:\n    def __repr__(self): raise RuntimeError('no repr')\nBad()");
    assert_eq!(r["error"]["type"], "RuntimeError");
}

#[test]
fn system_exit_is_an_error_result_not_an_exit() {
    let mut k = Kernel::start();
    for code in [
        "import sys; sys.exit(3)",
        "exit()",
        "quit(0)",
        "raise SystemExit('bye')",
    ] {
        let r = k.execute(code);
        assert_eq!(r["success"], false, "{code}");
        assert_eq!(r["error"]["type"], "SystemExit", "{code}");
    }
    assert_eq!(
        k.execute("import sys; sys.exit(3)")["error"]["message"],
        "3"
    );
    k.ok("still_alive = True");
}

#[test]
fn unicode_round_trips_and_bad_bytes_are_replaced() {
    let mut k = Kernel::start();
    let r = k.ok("작업 = '한국어 ✓ 🐍'\nprint(작업)\n작업");
    assert_eq!(r["stdout"], "한국어 ✓ 🐍\n");
    assert_eq!(r["result"], "'한국어 ✓ 🐍'");
    assert_eq!(r["added_vars"], json!(["작업"]));
    let r = k.ok("import os; os.write(1, b'ok \\xff\\xfe end\\n'); print('\\udcff')");
    assert_eq!(r["stdout"], "ok \u{fffd}\u{fffd} end\n\\udcff\n");
    assert!(
        r["warnings"][0]
            .as_str()
            .unwrap()
            .contains("not valid UTF-8"),
        "{r}"
    );
}

#[test]
fn big_outputs_arrive_whole_and_in_order() {
    let mut k = Kernel::start();
    let r = k.ok("print('a' * 1_000_000)");
    assert_eq!(r["stdout"].as_str().unwrap().len(), 1_000_001);
    let r =
        k.ok("import sys\nfor i in range(100_000):\n    print(i)\n    print(-i, file=sys.stderr)");
    let out: Vec<i64> = r["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(out, (0..100_000).collect::<Vec<_>>());
    let err: Vec<i64> = r["stderr"]
        .as_str()
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(err, (0..100_000).map(|i: i64| -i).collect::<Vec<_>>());
    let r = k.ok("print('b' * 50_000_000)");
    assert_eq!(r["stdout"].as_str().unwrap().len(), 50_000_001);
}

/// The final-expression detection (a text scan, no AST) agrees with Python's own parser on a
/// corpus of awkward cells: a value is reported exactly when the last statement is an
/// `ast.Expr` whose value is not None, and it is the value Python computes.
#[test]
fn final_expression_detection_agrees_with_pythons_ast() {
    let corpus: &[&str] = &[
        "1",
        "x = 1",
        "x = 1\nx",
        "x = 1; x",
        "x = 1;",
        "x;",
        "if True: 1",
        "if True:\n    1\n1",
        "for i in range(2): i\ni",
        "def f(): return 1\nf()",
        "@staticmethod\ndef g(): pass",
        "class A: pass\nA.__name__",
        "y = (1,\n  2)\ny",
        "y = [\n1,\n2]\n[y,\n y]",
        "a = b = 2\na",
        "a, b = 1, 2\na, b",
        "a += 1",
        "a -= 1; a",
        "c = 5\nc <<= 1\nc",
        "c >>= 1",
        "c",
        "c: int = 3",
        "c: int",
        "d = {'k': 1}\nd['k']",
        "d['k'] = 2",
        "d['k'] == 2",
        "s = 'a = b'\ns",
        "s = \"x; y\"\ns",
        "s = '''\nq = 1\n'''",
        "s = '''\nq = 1\n'''\ns.strip()",
        "t = r'\\'' + 'z'\nt",
        "f'{1 + 1}'",
        "f'{\"=\"}'",
        "lambda: 0",
        "(lambda q=1: q)()",
        "(z := 4)",
        "z",
        "print('hi')",
        "None",
        "assert True",
        "pass",
        "import math; math.floor(2.5)",
        "from math import floor\nfloor(3.5)",
        "x = 1 \\\n  + 2\nx",
        "x = [i for i in range(3)]\nx",
        "try:\n    1/0\nexcept ZeroDivisionError:\n    'caught'",
        "with open('/dev/null') as fh: fh.read()",
        "while False: pass",
        "del z",
        "global gg\ngg = 1\ngg",
        "  1 + 1",
        "# only a comment",
        "x = 1  # trailing comment",
        "x  # comment",
        "x\n# comment after\n",
        "\n\n\nx\n\n",
        "[1, 2][0]",
        "{1: 2}",
        "(1)",
        "not x",
        "-x",
        "x if x else 0",
        "*[1], 2",
        "x,",
        "match = 3\nmatch",
        "match (x):\n    case 1: 'one'\n    case _: 'other'",
        "type = 7\ntype",
        "async def af(): pass\naf.__name__",
        "await_ = 1\nawait_",
        "yield_ = 2\nyield_",
        "x = 1; y = 2; x + y",
        "if x: y = 1; y",
        "1; 2; 3",
        "elifs = 4\nelifs",
        "import_ = 5\nimport_",
        "x = 1\r\nx",
        "if x:\r\n    1\r\nx",
        "\tx",
        "x = 1 # c ; y",
        "s = '#'; s",
        "s = '\\\\'; s",
        "b'\\x00'",
        "'''a\"\"\"b'''",
        "\"\"\"\n'''\n\"\"\"",
        "x = (1 if True\n     else 2)\nx",
        "def f(\n    a=1,\n):\n    return a\nf()",
        "x = {\n 'a': 1, # comment with ) bracket\n}\nx",
        "x = 1\n\x0cx",
        "u'x'",
        "rb'\\d'",
        "Rb'x' + b'y'",
        "x = [\n    1,  # ]\n]\nlen(x)",
        "1 if x else (\n 2)",
        "q = 1\n  # indented comment\nq",
        "[*range(2), *range(2)]",
        "x, *rest = 1, 2, 3\nrest",
        "print(*[1, 2])",
        "x = 3\nx ** 2",
        "x = 3\nx * 2",
        "'a' 'b'",
        "('a'\n 'b')",
        "...",
        "x = 1\n\n\n",
        "x = '''\n;\n''' ; x",
        "f'{x!r}' ; f'{x}'",
    ];
    let mut k = Kernel::start();
    k.ok("x = 1\nc = 2\nz = 0\nd = {'k': 1}\na = 1");
    let tmp = tempfile::tempdir().unwrap();
    let corpus_file = tmp.path().join("corpus.json");
    std::fs::write(&corpus_file, serde_json::to_vec(corpus).unwrap()).unwrap();
    // Python's verdict for each cell: does it end in an expression statement?
    let verdicts = std::process::Command::new(flowrepl_tests::base_python())
        .arg("-c")
        .arg("import ast, json, sys\nout = []\nfor c in json.load(open(sys.argv[1])):\n    try:\n        t = ast.parse(c)\n        out.append(bool(t.body) and isinstance(t.body[-1], ast.Expr))\n    except SyntaxError:\n        out.append(None)\nprint(json.dumps(out))")
        .arg(&corpus_file)
        .output()
        .unwrap();
    let verdicts: Vec<Option<bool>> = serde_json::from_slice(&verdicts.stdout).unwrap();
    for (code, expr) in corpus.iter().zip(verdicts) {
        let r = k.execute(code);
        match expr {
            None => assert_eq!(
                r["debug_info"]["execution"], "syntax_error",
                "{code:?}: {r}"
            ),
            Some(false) => assert_eq!(
                r["result"],
                Value::Null,
                "{code:?} is not an expression: {r}"
            ),
            Some(true) if r["success"] == true => {
                // The value must be what Python gives for the last expression.
                if code.trim_end().ends_with(';') {
                    continue;
                }
                let want = k.execute(&format!(
                    "import ast as _ast\neval(compile(_ast.Expression(_ast.parse({code:?}).body[-1].value), '<t>', 'eval'))"
                ));
                // Object reprs carry addresses; compare what comes before them.
                let strip = |v: &Value| {
                    v.as_str()
                        .map(|s| s.split(" at 0x").next().unwrap().to_owned())
                };
                assert_eq!(strip(&r["result"]), strip(&want["result"]), "{code:?}");
            }
            Some(true) => {}
        }
    }
}

#[test]
fn list_variables_describes_the_namespace_in_both_modes() {
    for mode in MODES {
        let mut k = Kernel::options().mode(mode).start();
        k.ok("import os\nitems = [1, 2, 3]\ntext = 'é' * 500\n_hidden = 1");
        let r = k.call("list_variables", Value::Null);
        let r = &r["result"];
        let names: Vec<&str> = r["variables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["_hidden", "items", "os", "text"], "{mode}: {r}");
        assert_eq!(r["count"], 4);
        let items = &r["variables"][1];
        assert_eq!(
            (items["type"].as_str(), items["len"].as_u64()),
            (Some("list"), Some(3))
        );
        assert_eq!(items["repr"], "[1, 2, 3]");
        assert_eq!(r["variables"][2]["type"], "module");
        let text = r["variables"][3]["repr"].as_str().unwrap();
        assert!(
            text.chars().count() <= 120 && text.contains("..."),
            "{text}"
        );
        // Listing changes nothing a cell sees: no new imports, no new names.
        let next = k.ok("1");
        assert_eq!(next["added_imports"], json!([]), "{mode}");
        assert_eq!(next["added_vars"], json!([]));
        let bad = k.call("list_variables", json!({"x": 1}));
        assert_eq!(bad["error"]["code"], -32602);
    }
}
