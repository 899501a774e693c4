include!("build/python_env.rs");

fn main() {
    emit_python_link_facts();
}
