set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set output 'docs/results/real/table2.png'
set title 'table2'
set xlabel 'decode workers'
set ylabel 'mean TPOT vs best baseline (%)'
$d0 << EOD
8 -6.26275 -0.602344 -5.6604
16 -5.88871 -0.588436 -5.30028
24 -4.98847 -0.374096 -4.61438
EOD
plot $d0 using 1:2 with linespoints title 'gain_pct', $d0 using 1:3 with linespoints title 'control_pct', $d0 using 1:4 with linespoints title 'net_pct'
