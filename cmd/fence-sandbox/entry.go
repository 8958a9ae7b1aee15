package main

// boundingKeep is the bounding set an init keeps (nsinit's kept
// capabilities, as a bit mask): the in-sandbox binary's entry point drops
// the rest before the Go runtime starts (entry_linux_amd64.s).
const boundingKeep = 0xa00405fb
