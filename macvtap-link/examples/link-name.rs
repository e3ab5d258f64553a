//! Prints the macvtap link name for each device ID given, e.g.
//! `cargo run -p macvtap-link --example link-name -- eth0Mvp0`.

fn main() {
    for id in std::env::args().skip(1) {
        println!("{}", macvtap_link::link_name_for_device(&id));
    }
}
