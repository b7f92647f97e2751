# Cairn's A/B boot chooser: a U-Boot script, the same on a Raspberry Pi 4 (u-boot-rpi) and on
# QEMU's virt machine (u-boot-qemu) in the tests, so the logic the tests run is the logic a
# device runs. Compiled to boot.scr (mkimage -T script) at the root of the FAT boot partition,
# where U-Boot's distro boot finds it.
#
# Its state is RAUC's U-Boot boot-chooser state (RAUC's `uboot` backend reads and writes it
# with fw_setenv through /etc/fw_env.config), kept in cairn/boot.env on the FAT partition as
# a 16 KiB environment image with a CRC (mkenvimage; `env import -c` / `env export -c`):
#   BOOT_ORDER     the slots in the order to try them, the primary first ("A B")
#   BOOT_A_LEFT    the boots slot A has left (RAUC sets 3 when it installs or marks it good)
#   BOOT_B_LEFT    the same for B
# Each boot takes one try from the first slot in BOOT_ORDER that has one, writes the state
# back before the kernel starts, and boots that slot's kernel and initrd from its own root
# (/boot/vmlinuz, /boot/initrd.img: a slot's kernel is updated with its root). A slot that
# never reaches user space (where cairn-health marks it good) uses up its tries and the next
# slot in the order boots; a slot with no kernel to load gives up its tries at once. A missing
# or damaged state file means the defaults below.
setenv BOOT_ORDER "A B"
setenv BOOT_A_LEFT 3
setenv BOOT_B_LEFT 3
if load ${devtype} ${devnum}:1 ${scriptaddr} cairn/boot.env; then
    env import -c ${scriptaddr} 0x4000 BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT
fi
setenv slot
for s in ${BOOT_ORDER}; do
    if test "x${slot}" = "x"; then
        if test "${s}" = "A" && test ${BOOT_A_LEFT} -gt 0; then
            setexpr BOOT_A_LEFT ${BOOT_A_LEFT} - 1
            setenv slot A
            setenv rootpart 2
        elif test "${s}" = "B" && test ${BOOT_B_LEFT} -gt 0; then
            setexpr BOOT_B_LEFT ${BOOT_B_LEFT} - 1
            setenv slot B
            setenv rootpart 3
        fi
    fi
done
if test "x${slot}" = "x"; then
    # Every slot used up its tries (RAUC's reference script does the same): give them their
    # tries again and start over, rather than stop at a prompt nobody sees.
    echo "cairn: no slot has tries left: every slot gets 3 again"
    setenv BOOT_A_LEFT 3
    setenv BOOT_B_LEFT 3
    env export -c -s 0x4000 ${scriptaddr} BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT
    fatwrite ${devtype} ${devnum}:1 ${scriptaddr} cairn/boot.env 0x4000
    reset
fi
env export -c -s 0x4000 ${scriptaddr} BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT
fatwrite ${devtype} ${devnum}:1 ${scriptaddr} cairn/boot.env 0x4000
echo "cairn: booting slot ${slot} (order ${BOOT_ORDER}, tries left A ${BOOT_A_LEFT} B ${BOOT_B_LEFT})"
part uuid ${devtype} ${devnum}:${rootpart} rootuuid
# the board's own kernel arguments (consoles): cairn/bootargs.env, "cairn_cmdline=..."
setenv cairn_cmdline
if load ${devtype} ${devnum}:1 ${scriptaddr} cairn/bootargs.env; then
    env import -t ${scriptaddr} ${filesize} cairn_cmdline
fi
# panic=10: a kernel or initramfs that fails (no root found, a panic) restarts the board, so
# the slot uses up its tries instead of hanging at a prompt. rootwait=30: a kernel left
# without its initramfs (a damaged one) would otherwise wait for ever for a root device whose
# driver is a module; with the initramfs (every good boot) the initramfs finds the root.
setenv bootargs "root=PARTUUID=${rootuuid} rootwait=30 ro panic=10 rauc.slot=${slot} ${cairn_cmdline}"
if load ${devtype} ${devnum}:${rootpart} ${kernel_addr_r} /boot/vmlinuz; then
    # The initrd goes 64 MiB above the end of the kernel (room for what it unpacks): the Pi's
    # ramdisk_addr_r leaves 38 MiB for the kernel, less than Debian's arm64 kernel needs.
    setexpr initrd_addr ${kernel_addr_r} + ${filesize}
    setexpr initrd_addr ${initrd_addr} / 0x200000
    setexpr initrd_addr ${initrd_addr} * 0x200000
    setexpr initrd_addr ${initrd_addr} + 0x4000000
    if load ${devtype} ${devnum}:${rootpart} ${initrd_addr} /boot/initrd.img; then
        booti ${kernel_addr_r} ${initrd_addr}:${filesize} ${fdt_addr}
    fi
fi
# Only when the slot has no kernel U-Boot can start (an empty or torn slot): its tries are
# gone at once, and the next boot takes the next slot. Falling through to U-Boot's other boot
# targets would end at a prompt nobody sees.
echo "cairn: slot ${slot} has no kernel to boot: it gets no more tries"
setenv BOOT_${slot}_LEFT 0
env export -c -s 0x4000 ${scriptaddr} BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT
fatwrite ${devtype} ${devnum}:1 ${scriptaddr} cairn/boot.env 0x4000
reset
