//! `abi-layout`: prints the xenpmu page layout (the table docs/abi.md carries), with every
//! offset and size taken from the Rust compiler.

fn main() {
    println!(
        "xenpmu ABI {}.{}: page {} bytes, defined part {} bytes, vendor area at {} ({} bytes)\n",
        vpmu_abi::XENPMU_VERSION_MAJOR,
        vpmu_abi::XENPMU_VERSION_MINOR,
        vpmu_abi::XENPMU_PAGE_SIZE,
        vpmu_abi::XENPMU_DEFINED_SIZE_1_0,
        core::mem::offset_of!(vpmu_abi::Page, vendor),
        vpmu_abi::XENPMU_VENDOR_AREA_SIZE,
    );
    println!("{}", vpmu_abi_header::doc_layout_block());
}
