# Cairn's A/B boot chooser: a U-Boot script, the same on a Raspberry Pi 3/4 (u-boot-rpi) and
# on QEMU's virt machine (u-boot-qemu) in the tests, so the logic the tests run is the logic a
# device runs. Compiled to boot.scr (mkimage -T script) at the root of the FAT boot partition,
# where U-Boot's boot flow finds it.
#
# Its state is RAUC's U-Boot boot-chooser state:
#   BOOT_ORDER     the slots in the order to try them, the primary first ("A B")
#   BOOT_A_LEFT    the boots slot A has left (RAUC sets 3 when it installs or marks it good)
#   BOOT_B_LEFT    the same for B
# Each boot takes one try from the first slot in BOOT_ORDER that has one, writes the state
# back before the kernel starts, and boots that slot's kernel and initrd from its own root
# (/boot/vmlinuz, /boot/initrd.img: a slot's kernel is updated with its root). A slot that
# never reaches user space (where cairn-health marks it good) uses up its tries and the next
# slot in the order boots; a slot with no kernel to load gives up its tries at once.
#
# Where the state lives, so that a power cut cannot take the boot partition with it: nothing
# here writes the FAT. The state is a redundant U-Boot environment in raw sectors of the card,
# outside every partition, as libubootenv's fw_setenv (RAUC's writer, /etc/fw_env.config)
# lays it out: two copies of 16 KiB, at 8 MiB and at 16 MiB of the card, each in an erase
# block of its own (the MBR is in the first, the FAT starts at 24 MiB), each a CRC32, a
# counter byte and the variables. The copy with a good CRC and the newer counter (255 is
# followed by 0) is the state; a write goes to the other copy, with the counter one higher,
# so a write torn by a power cut leaves the copy before it whole. With no good copy (a new
# card before its first boot, both copies damaged) the state is the defaults below.
#
# u-boot-rpi's `env import -c` reads a CRC followed by the variables (its environment is a
# single one): a copy is checked and read by moving its CRC next to its variables.
setenv BOOT_ORDER "A B"
setenv BOOT_A_LEFT 3
setenv BOOT_B_LEFT 3
# scratch memory: where the kernel goes, once the state is written
setexpr cairn_raw0 ${kernel_addr_r} + 0
setexpr cairn_raw1 ${kernel_addr_r} + 0x4000
setexpr cairn_env0 ${kernel_addr_r} + 0x8000
setexpr cairn_env1 ${kernel_addr_r} + 0xc000
${devtype} dev ${devnum}
setenv cairn_ok0 0
setenv cairn_ok1 0
for cairn_i in 0 1; do
    if test ${cairn_i} = 0; then
        setenv cairn_blk 0x4000
        setenv cairn_raw ${cairn_raw0}
        setenv cairn_env ${cairn_env0}
    else
        setenv cairn_blk 0x8000
        setenv cairn_raw ${cairn_raw1}
        setenv cairn_env ${cairn_env1}
    fi
    setenv cairn_ok 0
    if ${devtype} read ${cairn_raw} ${cairn_blk} 0x20; then
        cp.b ${cairn_raw} ${cairn_env} 4
        setexpr cairn_from ${cairn_raw} + 5
        setexpr cairn_to ${cairn_env} + 4
        cp.b ${cairn_from} ${cairn_to} 0x3ffb
        # a check of the CRC that imports nothing
        if env import -c ${cairn_env} 0x3fff cairn_none; then
            setenv cairn_ok 1
            setexpr cairn_from ${cairn_raw} + 4
            setexpr.b cairn_flags *${cairn_from}
        fi
    fi
    if test ${cairn_i} = 0; then
        setenv cairn_ok0 ${cairn_ok}
        setenv cairn_flags0 ${cairn_flags}
    else
        setenv cairn_ok1 ${cairn_ok}
        setenv cairn_flags1 ${cairn_flags}
    fi
done
# which copy is the state: libubootenv's rule
setenv cairn_current none
if test ${cairn_ok0} = 1; then
    setenv cairn_current 0
fi
if test ${cairn_ok1} = 1; then
    if test ${cairn_ok0} = 0; then
        setenv cairn_current 1
    elif test 0x${cairn_flags1} -gt 0x${cairn_flags0}; then
        setenv cairn_current 1
    fi
    if test ${cairn_ok0} = 1 && test 0x${cairn_flags0} -eq 0xff && test 0x${cairn_flags1} -eq 0; then
        setenv cairn_current 1
    fi
    if test ${cairn_ok0} = 1 && test 0x${cairn_flags1} -eq 0xff && test 0x${cairn_flags0} -eq 0; then
        setenv cairn_current 0
    fi
fi
# the next write: to the other copy, its counter one above the state's
setenv cairn_next 0
setenv cairn_blk 0x4000
if test ${cairn_current} = 0; then
    env import -c ${cairn_env0} 0x3fff BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT
    setexpr cairn_next 0x${cairn_flags0} + 1
    setenv cairn_blk 0x8000
elif test ${cairn_current} = 1; then
    env import -c ${cairn_env1} 0x3fff BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT
    setexpr cairn_next 0x${cairn_flags1} + 1
else
    echo "cairn: no boot state on the card (new, or both copies damaged): slot A first"
fi
if test 0x${cairn_next} -eq 0x100; then
    setenv cairn_next 0
fi
# writes the state to the copy at ${cairn_blk}: the variables with their CRC, put back
# around the counter
setenv cairn_save 'env export -c -s 0x3fff ${cairn_env0} BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT; cp.b ${cairn_env0} ${cairn_raw0} 4; setexpr cairn_to ${cairn_raw0} + 4; mw.b ${cairn_to} ${cairn_next} 1; setexpr cairn_from ${cairn_env0} + 4; setexpr cairn_to ${cairn_raw0} + 5; cp.b ${cairn_from} ${cairn_to} 0x3ffb; ${devtype} write ${cairn_raw0} ${cairn_blk} 0x20'

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
    run cairn_save
    reset
fi
run cairn_save
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
    # (On a Pi 3 the firmware's device tree is at 128 MiB: kernel, 64 MiB and initrd fit
    # below it, 38 + 64 + 13 MiB for trixie's.)
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
# targets would end at a prompt nobody sees. (The state written above is the current copy
# now: this write goes to the other one.)
echo "cairn: slot ${slot} has no kernel to boot: it gets no more tries"
setenv BOOT_${slot}_LEFT 0
setexpr cairn_next 0x${cairn_next} + 1
if test 0x${cairn_next} -eq 0x100; then
    setenv cairn_next 0
fi
if test ${cairn_blk} = 0x4000; then
    setenv cairn_blk 0x8000
else
    setenv cairn_blk 0x4000
fi
run cairn_save
reset
